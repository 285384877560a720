"""The task list's kept rows (taskhub/web/templatetags/taskhub_rows.py): after any change a row shows, the page has the
row as it renders afresh, however the change was written (a service, or an UPDATE that leaves updated_at as it was),
as time passes, and for each reader (language, whether rows can be ticked). So has its kept filter bar."""

import datetime
import gc
import re

import django.test.client
import pytest
from django import forms
from django.contrib.auth import get_user_model
from django.template import Context
from django.urls import reverse
from django.utils import timezone

from taskhub.api.tokens import create_token
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks.models import InputRequest, Task
from taskhub.web.templatetags import taskhub_rows
from tests.task_page_fixtures import durable, signed_in

pytestmark = pytest.mark.django_db

ROW = re.compile(r'<tr id="task-row-.*?</tr>', re.S)


def rows(client) -> list[str]:
    response = client.get(reverse("tasks:list"))
    assert response.status_code == 200
    return ROW.findall(response.content.decode())


def test_a_kept_row_is_the_row_rendered_afresh_after_each_change_it_shows(client, alpha, olga, amy, monkeypatch):
    working = durable(alpha, olga, statusMessage="copying")
    done = durable(alpha, olga, status="completed", result={"content": [{"type": "text", "text": "42 rows"}]})
    failed = durable(alpha, olga, status="failed", error={"code": -32603, "message": "boom"})
    signed_in(client, olga)
    now = timezone.now()

    def shows(change) -> None:
        before = rows(client)  # kept from the renders before
        assert rows(client) == before
        change()
        kept = rows(client)
        taskhub_rows.forget_kept_rows()
        afresh = rows(client)
        assert kept == afresh
        assert kept != before, "the change was not one the rows show"

    def update(task, **fields):
        return lambda: Task.objects.filter(pk=task.pk).update(**fields)

    shows(update(working, status_message="halfway"))
    shows(update(working, progress=3, progress_total=10))
    shows(update(done, result={"content": [{"type": "text", "text": "43 rows"}]}))
    shows(update(done, result={"content": [{"type": "text", "text": "43 rows"}], "isError": True}))
    # A person's decline: the row's columns stay as they were, its outcome does not.
    shows(
        lambda: InputRequest.objects.create(
            task=done,
            server=alpha,
            key="go",
            method="elicitation/create",
            state="delivered",
            answer={"action": "decline"},
        )
    )
    shows(update(failed, error={"code": -1, "kind": "not_approved"}))  # declined at the gate
    shows(update(working, launched_via_label="ci-bot"))
    shows(update(working, cancel_requested_at=now))
    shows(update(working, status="cancelled", cancel_requested_by=olga, finished_at=now))
    shows(lambda: Server.objects.filter(pk=alpha.pk).update(name="alpha-two"))
    shows(lambda: get_user_model().objects.filter(pk=olga.pk).update(username="olga-two"))
    # Time passes: "just now" becomes "10 min ago".
    later = now + datetime.timedelta(minutes=10)
    shows(lambda: monkeypatch.setattr(timezone, "now", lambda: later))
    # Retrying its launch, the row says when the next try is due; seconds later, within the same minute, it is under
    # way: such a row is never kept.
    long_ago = later - datetime.timedelta(hours=2)
    shows(
        update(
            failed,
            status="launching",
            launch_attempts=2,
            launch_next_try_at=later + datetime.timedelta(seconds=5),
            created_at=long_ago,
            updated_at=long_ago,
            finished_at=None,
        )
    )
    shows(lambda: monkeypatch.setattr(timezone, "now", lambda: later + datetime.timedelta(seconds=10)))
    # Another reader: one who cannot tick rows, then the same in Chinese.
    shows(lambda: signed_in(client, amy))
    shows(lambda: client.cookies.load({"django_language": "zh-hans"}))


BAR = re.compile(r'<form class="task-filters".*?</form>', re.S)


def test_a_rows_column_names_are_in_the_readers_language_kept_or_not(client, alpha, olga):
    # data-label: what a phone's stacked table shows beside each cell (taskhub_i18n keeps them per language).
    durable(alpha, olga)
    signed_in(client, olga)
    labels = re.compile(r'data-label="([^"]*)"')
    for language in ("en", "zh-hans", "en", "zh-hans"):  # the second of each from the kept row
        row = client.get(reverse("tasks:list"), headers={"Accept-Language": language}).content.decode()
        shown = labels.findall(ROW.search(row).group(0))
        english = ["Tick", "Status", "Outcome", "Tool", "Message", "Launched by", "Started", "Duration", "Last change"]
        if language == "en":
            assert shown == english
        else:
            assert shown[1] == "状态" and shown[-1] == "最近变更" and not set(shown) & set(english), shown


def test_the_kept_filter_bar_is_the_bar_drawn_afresh_after_each_change_it_shows(client, alpha, olga, amy, monkeypatch):
    durable(alpha, olga)
    signed_in(client, olga)
    path = [reverse("tasks:list")]
    drawn = []
    draw = forms.Widget.render
    monkeypatch.setattr(
        forms.Widget, "render", lambda widget, *args, **kwargs: drawn.append(widget) or draw(widget, *args, **kwargs)
    )

    def bar() -> str:
        response = client.get(path[0])
        assert response.status_code == 200
        return BAR.search(response.content.decode()).group(0)

    def shows(change) -> None:
        before = bar()
        drawn.clear()
        assert bar() == before and not drawn, "kept: no widget drawn again"
        change()
        kept = bar()
        taskhub_rows.forget_kept_rows()
        assert kept == bar()
        assert kept != before, "the change was not one the bar shows"

    def go(to: str):
        return lambda: path.__setitem__(0, to)

    shows(go("/tasks/?q=deploy"))
    shows(go("/tasks/?q=deploy&status=working"))  # the tab, kept in a hidden field
    shows(go("/tasks/?q=deploy&since=2026-12-02&until=2026-12-01"))  # a filter that does not fit
    shows(go("/tasks/?mine=on&server=" + str(alpha.pk)))
    # The choices read from the database: a server's first task, a server renamed, an API token made.
    gamma = create_server(name="gamma", transport="http", url="http://127.0.0.1:9/gamma", user=None)
    shows(lambda: durable(gamma, olga))  # the select lists the servers of the tasks one sees
    shows(lambda: Server.objects.filter(pk=alpha.pk).update(name="alpha-two"))
    shows(lambda: create_token(user=olga, name="ci-bot"))
    # Another reader: an approver, who cannot cancel the matching tasks nor filter by another's server; in Chinese.
    shows(lambda: signed_in(client, amy))
    shows(lambda: client.cookies.load({"django_language": "zh-hans"}))
    # The live re-fetch of the results draws no bar, and reads none of its choices.
    drawn.clear()
    assert client.get(path[0], headers={"HX-Request": "true"}).status_code == 200
    assert not drawn


def test_a_list_page_leaves_its_rows_to_reference_counting_not_to_the_garbage_collector(
    client, alpha, olga, monkeypatch
):
    # A reference cycle through the page's context (its filter bar's key once held the context) left every row, the
    # form and the context to the cyclic collector: a young collection every 50 list pages, 10-25 ms each.
    # The test client's copies of each template's context (response.context) make cycles of their own: not kept.
    monkeypatch.setattr(django.test.client, "store_rendered_templates", lambda *args, **kwargs: None)
    for _ in range(3):
        durable(alpha, olga)
    signed_in(client, olga)
    assert len(rows(client)) == 3
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        assert len(rows(client)) == 3
        gc.collect()
        left = [kind.__name__ for kind in map(type, gc.garbage) if issubclass(kind, Task | forms.Form | Context)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == [], left
