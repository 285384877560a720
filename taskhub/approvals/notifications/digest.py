"""One person's digest: everything waiting for them in the outbox, in one mail (plain text and HTML), with a link
straight to each card (the first LINKS_PER_KIND of each kind; "and 180 more" links to the list of the rest).

Every string that came from an MCP server (a request's message, a tool's name) is cut to one line of at most
TEXT_MAX_CHARS and escaped in the HTML part by the template; the subject carries only counts and taskhub's words.
The mail is written in the language the person chose on their profile (none chosen: LANGUAGE_CODE, English: a mail has
no browser to ask).
"""

import datetime
import logging
import re
import smtplib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMultiAlternatives
from django.db import transaction
from django.db.models import F
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone, translation
from django.utils.translation import gettext, ngettext_lazy
from django.utils.translation import gettext_lazy as _

from taskhub.accounts.models import Profile
from taskhub.approvals.models import MailEvent, NotificationKind, NotificationPreferences
from taskhub.approvals.notifications import outbox, recipients
from taskhub.audit.services import WORKER, record_event
from taskhub.tasks.models import GATE_METHOD, InputRequestState, TaskStatus

logger = logging.getLogger(__name__)

LINKS_PER_KIND = 20
TEXT_MAX_CHARS = 200
ERROR_MAX_CHARS = 500
# A mail server that is down or answers 4xx ("try later") is tried again: by the job's retries for about an hour,
# then by the sweep's new job, and so on. After this many failed tries of an event (about three hours) it is given
# up. A 5xx refusal of the address is final at once: asking again gets the same answer.
FAILURES_AT_MOST = 42
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")

# How the subject and the headings count each kind.
PHRASES = {
    NotificationKind.REQUEST_WAITING: ngettext_lazy("%(n)s request waits for you", "%(n)s requests wait for you", "n"),
    NotificationKind.DEADLINE_NEAR: ngettext_lazy(
        "%(n)s answer deadline is near", "%(n)s answer deadlines are near", "n"
    ),
    NotificationKind.DEFAULT_APPLIED: ngettext_lazy("%(n)s default was applied", "%(n)s defaults were applied", "n"),
    NotificationKind.TASK_FINISHED: ngettext_lazy(
        "%(n)s task you launched finished", "%(n)s tasks you launched finished", "n"
    ),
    NotificationKind.SERVER_NEEDS_AUTHORIZATION: ngettext_lazy(
        "%(n)s server needs an admin to connect it again", "%(n)s servers need an admin to connect them again", "n"
    ),
}
OUTCOMES = {
    "declined": _("taskhub declined it"),
    "cancelled": _("taskhub cancelled the task"),
    "answered": _("taskhub sent the policy's answer"),
    "escalated": _("handed to the escalation group"),
    "not approved": _("the launch was not approved"),
}


def one_line(text: Any, limit: int = TEXT_MAX_CHARS) -> str:
    """Untrusted text as one line of at most `limit` characters."""
    text = " ".join(CONTROL.sub(" ", str(text or "")).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def counted(kind: str, n: int) -> str:
    return PHRASES[NotificationKind(kind)] % {"n": n}


def link(path: str) -> str:
    return f"{settings.TASKHUB_BASE_URL}{path}"


@dataclass
class Item:
    text: str
    where: str
    note: str
    url: str
    from_server: bool = False


@dataclass
class Section:
    kind: str
    heading: str
    items: list[Item] = field(default_factory=list)
    more: int = 0
    more_url: str = ""


def _item(event: MailEvent) -> Item:
    if event.kind == NotificationKind.SERVER_NEEDS_AUTHORIZATION:
        return _server_item(event)
    task = event.task
    where = (
        gettext("%(tool)s on %(server)s")
        % {"tool": one_line(task.tool, 100), "server": one_line(task.server.name, 100)}
        if task is not None
        else ""
    )
    url = link(reverse("tasks:detail", args=[task.pk])) if task is not None else link(reverse("tasks:inbox"))
    text, note, from_server = where, "", False
    if event.input_request is not None:
        params = event.input_request.params if isinstance(event.input_request.params, dict) else {}
        text = one_line(params.get("message"))
        from_server = bool(text) and event.input_request.method != GATE_METHOD  # taskhub words its gate itself
        text = text or gettext("%(where)s asks for input") % {"where": where}
        url += f"#ir-{event.input_request.pk}"
    if event.kind == NotificationKind.DEADLINE_NEAR and event.detail.get("deadline"):
        note = gettext("answer by %(when)s") % {"when": _when(event.detail["deadline"])}
    elif event.kind == NotificationKind.DEFAULT_APPLIED:
        outcome = one_line(event.detail.get("outcome"), 40)
        said = gettext("taskhub applied the default: %(outcome)s") % {"outcome": outcome} if outcome else ""
        note = str(OUTCOMES.get(outcome, said))
    elif event.kind == NotificationKind.TASK_FINISHED:
        status = one_line(event.detail.get("status"), 40)
        shown = TaskStatus(status).label if status in TaskStatus.values else status
        note = gettext("ended %(status)s") % {"status": shown}
    return Item(text=text, where=where, note=note, url=url, from_server=from_server)


def _server_item(event: MailEvent) -> Item:
    """A server waiting for an admin's Connect (no task): its page, where the Connect button is."""
    server_id = event.detail.get("server_id")
    name = one_line(event.detail.get("server"), 100)
    url = link(reverse("servers:detail", args=[server_id])) if isinstance(server_id, int) else link("/servers/")
    text = gettext("%(server)s: its OAuth token could not be refreshed") % {"server": name}
    note = gettext("launches and answers for it wait until an admin connects it again")
    return Item(text=text, where=name, note=note, url=url)


def _when(iso: Any) -> str:
    """ "2026-12-01 14:02 UTC" (mails are read anywhere: UTC, named)."""
    try:
        moment = datetime.datetime.fromisoformat(str(iso))
    except ValueError:
        return one_line(iso, 40)
    if moment.tzinfo is not None:
        moment = moment.astimezone(datetime.UTC)
    return f"{moment:%Y-%m-%d %H:%M} UTC"


def build(user, events: list[MailEvent]) -> EmailMultiAlternatives:
    language = Profile.objects.filter(user=user).values_list("language", flat=True).first()
    with translation.override(language or settings.LANGUAGE_CODE):
        return _build(user, events)


def _build(user, events: list[MailEvent]) -> EmailMultiAlternatives:
    sections = []
    for kind in NotificationKind:
        of_kind = [event for event in events if event.kind == kind]
        if not of_kind:
            continue
        more_url = (
            link(reverse("tasks:list") + "?mine=on")
            if kind == NotificationKind.TASK_FINISHED
            else link(reverse("servers:list"))
            if kind == NotificationKind.SERVER_NEEDS_AUTHORIZATION
            else link(reverse("tasks:inbox"))
        )
        sections.append(
            Section(
                kind=kind,
                heading=counted(kind, len(of_kind)),
                items=[_item(event) for event in of_kind[:LINKS_PER_KIND]],
                more=max(0, len(of_kind) - LINKS_PER_KIND),
                more_url=more_url,
            )
        )
    subject = "taskhub: " + ", ".join(section.heading for section in sections)
    context = {
        "user": user,
        "sections": sections,
        "inbox_url": link(reverse("tasks:inbox")),
        "preferences_url": link(reverse("notifications:preferences")),
    }
    message = EmailMultiAlternatives(
        subject=subject,
        body=render_to_string("approvals/mail/digest.txt", context),
        to=[user.email],
    )
    message.attach_alternative(render_to_string("approvals/mail/digest.html", context), "text/html")
    return message


def send_digest(*, user_id: int) -> str:
    """Mail this person everything waiting for them. Raises when the mail server cannot take it now (down, or a 4xx
    reply): the events stay waiting (the transaction rolls back) and the job tries again, up to FAILURES_AT_MOST
    tries. A permanent refusal of the address (5xx) gives the events up at once, and the job ends."""
    if not MailEvent.objects.waiting().filter(user_id=user_id).exists():
        return "nothing waiting"
    last = outbox.last_digest_at(user_id)
    if last is not None and last + outbox.window() > timezone.now():
        with transaction.atomic():
            outbox.schedule_digest(user_id)  # this job is running, so its queueing lock lets the next one wait
        return "within the window: the next digest waits for its end"
    tried_at = timezone.now()
    try:
        return _send(user_id)
    except Exception as error:
        refusal = permanent_refusal(error)
        if refusal is not None:
            return _give_up(user_id, why=refusal, tried_at=tried_at, all_of_them=True)
        if _count_failure(user_id, error, tried_at=tried_at):
            raise
        return "gave up: too many failed tries"


def permanent_refusal(error: BaseException) -> str | None:
    """The mail server's reply when it refused the recipient for good (5xx to RCPT TO), else None. A digest has one
    recipient, so such a refusal is of this person's address; anything else (the server down, a 4xx reply, a
    refused sender or sign-in: taskhub's own settings) may pass."""
    if not isinstance(error, smtplib.SMTPRecipientsRefused) or not error.recipients:
        return None
    replies = list(error.recipients.values())
    if not all(isinstance(code, int) and 500 <= code < 600 for code, _ in replies):
        return None
    code, text = replies[0]
    text = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
    return one_line(f"refused by the mail server: {code} {text}", ERROR_MAX_CHARS)


@transaction.atomic
def _send(user_id: int) -> str:
    events = list(
        MailEvent.objects.select_for_update(no_key=True, skip_locked=True, of=("self",))
        .waiting()
        .filter(user_id=user_id)
        .select_related("task__server", "input_request")
        .order_by("created_at", "pk")
    )
    if not events:
        return "nothing waiting"
    user = get_user_model().objects.filter(pk=user_id).first()
    preferences = NotificationPreferences.objects.filter(user_id=user_id).first()
    wanted = [event for event in events if _wants(preferences, event.kind) and _still_news(event)]
    if user is None or not user.is_active or not user.email or not wanted:
        # Nobody to mail (the address was removed, the preference turned off since): nothing will ever carry these.
        MailEvent.objects.filter(pk__in=[event.pk for event in events]).update(sent_at=timezone.now())
        return "nothing to mail"
    build(user, wanted).send()
    MailEvent.objects.filter(pk__in=[event.pk for event in events]).update(sent_at=timezone.now(), last_error="")
    kinds = Counter(event.kind for event in wanted)
    record_event(
        action="notification.mail_sent",
        actor_label=WORKER,
        data={"to": user.get_username(), "events": len(wanted), "kinds": dict(sorted(kinds.items()))},
    )
    return f"mailed {len(wanted)} event(s) to {user.get_username()}"


# What asks for an answer is news only while its request is open: one answered (by anyone), cancelled or gone since
# the event was recorded is left out of the digest, and settled with it (issue 34, item 7).
ASKS_FOR_AN_ANSWER = frozenset({NotificationKind.REQUEST_WAITING, NotificationKind.DEADLINE_NEAR})


def _still_news(event: MailEvent) -> bool:
    if event.kind not in ASKS_FOR_AN_ANSWER:
        return True
    return event.input_request is not None and event.input_request.state == InputRequestState.OPEN


def _wants(preferences: NotificationPreferences | None, kind: str) -> bool:
    """The person's choice now: one turned off since the event was recorded is respected."""
    return preferences.wants(kind) if preferences is not None else recipients.DEFAULT_ON[NotificationKind(kind)]


def _count_failure(user_id: int, error: BaseException, *, tried_at: datetime.datetime) -> bool:
    """Count the failed try on the events it carried, give up those out of tries; whether any are left to retry."""
    why = one_line(f"{type(error).__name__}: {error}", ERROR_MAX_CHARS)
    try:
        tried = MailEvent.objects.waiting().filter(user_id=user_id, created_at__lte=tried_at)
        tried.update(failures=F("failures") + 1, last_error=why)
        if tried.filter(failures__gte=FAILURES_AT_MOST).exists():
            _give_up(user_id, why=f"{FAILURES_AT_MOST} tries failed, the last: {why}", tried_at=tried_at)
        return MailEvent.objects.waiting().filter(user_id=user_id).exists()
    except Exception:  # the database may be what failed; the job's retry is what matters
        logger.warning("mail digest for user %s: could not record the failure", user_id, exc_info=True)
        return True


@transaction.atomic
def _give_up(user_id: int, *, why: str, tried_at: datetime.datetime, all_of_them: bool = False) -> str:
    """Stop trying to mail these events (all the waiting ones the digest carried, or those out of tries): recorded
    on them and in the audit trail, logged once."""
    why = one_line(why, ERROR_MAX_CHARS)
    events = MailEvent.objects.waiting().filter(user_id=user_id, created_at__lte=tried_at)
    if not all_of_them:
        events = events.filter(failures__gte=FAILURES_AT_MOST)
    given_up = events.update(
        gave_up_at=timezone.now(),
        last_error=why,
        failures=F("failures") + 1 if all_of_them else F("failures"),
    )
    username = (
        get_user_model().objects.filter(pk=user_id).values_list(get_user_model().USERNAME_FIELD, flat=True).first()
        or ""
    )
    record_event(
        action="notification.mail_given_up",
        actor_label=WORKER,
        data={"to": username, "events": given_up, "error": why},
    )
    logger.warning("mail digest for user %s: gave up %d event(s): %s", user_id, given_up, why)
    return f"gave up {given_up} event(s) of {username}: {why}"
