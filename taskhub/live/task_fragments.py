"""What the task pages and the inbox receive over the live socket about a changed task (registered in
LiveConfig.ready()).

- The list (FragmentKind.TASKS, for those who see every task; and FragmentKind.INBOX, so an approver's list of
  their servers' tasks follows too): a signal, `<template id="tasks-live-signal" hx-swap-oob="none:body">`
  holding the task's row (inert: a template's content is not part of the page). Its target, body, exists on
  every page, so htmx never reports a missing oob target wherever the user is, and the swap style `none` changes
  nothing. static/taskhub/tasks.js on the list page hears it (htmx:oobBeforeSwap), puts the row in place of the
  one the page shows (if it shows it: the change is on screen without waiting for a request), and re-fetches the
  table and the tab counts with the page's own filters and page number, then highlights the rows whose version
  changed. Rows alone could not respect the filters, the tabs or the paging: the re-fetch settles those.
- The detail page (only for a connection watching that task, which the consumer grants only to who may see it):
  every live section of the page, out of band, from the page's own template, in two parts: FragmentKind.TASK_STATUS,
  the header and the status message, which need nothing but the task; then FragmentKind.TASK, the input requests,
  the result, the facts and the timeline, which read more.
- The inbox (FragmentKind.INBOX): taskhub/tasks/live_inbox.py.
"""

from django.template.loader import render_to_string

from taskhub.accounts import permissions
from taskhub.live.access import access_in_force
from taskhub.live.fragments import FragmentKind, Sharing, register_task_fragment
from taskhub.tasks.live_inbox import inbox_fragment
from taskhub.tasks.outcomes import settle_outcomes, with_row_facts_of
from taskhub.tasks.presenters import details_context, status_context

LIST_TEMPLATE = "tasks/list.html"
DETAIL_TEMPLATE = "tasks/detail.html"


def list_signal(task, user) -> str:
    # The row as the list shows it: with the error code and result preview the list's query adds and the outcome
    # settle_outcomes gives it, worked out from the task as read for the change (with its server, launcher and who
    # asked to cancel).
    [row] = settle_outcomes([with_row_facts_of(task)])
    return render_to_string(f"{LIST_TEMPLATE}#live-signal", {"task": row})


def list_signal_for_approver(task, user) -> str:
    # Someone who sees every task hears it through FragmentKind.TASKS already: one signal is enough.
    return "" if access_in_force(user).sees_all_tasks else list_signal(task, user)


def detail_status(task, user) -> str:
    if not permissions.may_see_task(user, task):  # the consumer checked already; a page never relies on that alone
        return ""
    return render_to_string(f"{DETAIL_TEMPLATE}#live-status", {**status_context(task, user), "oob": True})


def detail_sections(task, user) -> str:
    if not permissions.may_see_task(user, task):
        return ""
    return render_to_string(f"{DETAIL_TEMPLATE}#live-details", {**details_context(task, user), "oob": True})


def register() -> None:
    register_task_fragment(FragmentKind.INBOX, inbox_fragment)
    # The signal and its row name nothing of the user: one rendering per change serves a whole audience.
    register_task_fragment(FragmentKind.TASKS, list_signal, sharing=Sharing.AUDIENCE)
    register_task_fragment(FragmentKind.INBOX, list_signal_for_approver, sharing=Sharing.AUDIENCE)
    register_task_fragment(FragmentKind.TASK_STATUS, detail_status)
    register_task_fragment(FragmentKind.TASK, detail_sections)
