"""The audit pages: the filtered list, its CSV / JSON export, the timeline partial and the read-only admin."""

import csv
import datetime
import io
import json
import uuid

import pytest
from django.db import DatabaseError, transaction
from django.urls import reverse

from taskhub.accounts.groups import ADMINS, APPROVERS, OPERATORS
from taskhub.audit.admin import AuditEventAdmin
from taskhub.audit.models import AuditEvent
from taskhub.audit.queries import filtered_events
from taskhub.audit.services import record_event
from taskhub.audit.views import EXPORT_COLUMNS
from tests.account_fixtures import make_user
from tests.audit_fixtures import SCRIPT, make_audit_history

pytestmark = pytest.mark.django_db

LIST = reverse("audit:list")
CSV = reverse("audit:export", args=["csv"])
JSON = reverse("audit:export", args=["json"])
UTC = datetime.UTC


@pytest.fixture
def admin():
    return make_user("alex", ADMINS)


@pytest.fixture
def operator():
    return make_user("olga", OPERATORS)


@pytest.fixture
def history(admin, operator):
    return make_audit_history(admin, operator)


class WholeTrail:
    """The admin's client, asking the audit pages for everything (made_by=all) unless a test says whose events: these
    tests read the whole trail; the page's default (people's actions) has its own test."""

    def __init__(self, client) -> None:
        self.client = client

    def get(self, path, data=None, **kwargs):
        if path in (LIST, CSV, JSON):
            data = {**(data or {})}
            data.setdefault("made_by", "all")
        return self.client.get(path, data, **kwargs)

    def __getattr__(self, name):
        return getattr(self.client, name)


@pytest.fixture
def as_admin(client, admin):
    client.force_login(admin)
    return WholeTrail(client)


def shown_actions(response) -> list[str]:
    return [event.action for event in response.context["page"].object_list]


def body(response) -> str:
    """A streamed export's whole text (the async stream is consumed synchronously by the test client)."""
    with pytest.warns(Warning, match="StreamingHttpResponse must consume asynchronous iterators"):
        return b"".join(response).decode()


# --- permissions ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", [LIST, CSV, JSON])
def test_anonymous_users_are_sent_to_sign_in(client, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("accounts:login"))


@pytest.mark.parametrize("url", [LIST, CSV, JSON])
@pytest.mark.parametrize("group", [OPERATORS, APPROVERS])
def test_operators_and_approvers_are_refused(client, url, group):
    client.force_login(make_user("someone", group))
    response = client.get(url)
    assert response.status_code == 403
    assert b"This page is for admins" in response.content
    assert not AuditEvent.objects.filter(action="audit.exported").exists()


@pytest.mark.parametrize("url", [LIST, CSV, JSON])
def test_admins_and_superusers_may(client, admin, url):
    for user in (admin, make_user("root", is_superuser=True)):
        client.force_login(user)
        response = client.get(url)
        assert response.status_code == 200
        if url != LIST:
            body(response)


def test_an_unknown_export_format_is_not_found(as_admin):
    assert as_admin.get(reverse("audit:export", args=["xlsx"])).status_code == 404


def test_the_export_refuses_post(as_admin):
    assert as_admin.post(CSV).status_code == 405


# --- the list and its filters --------------------------------------------------------------------------


def test_the_list_shows_every_event_newest_first(as_admin, history):
    response = as_admin.get(LIST)
    events = list(response.context["page"].object_list)
    assert len(events) == AuditEvent.objects.count() == 12
    assert [e.id for e in events] == sorted((e.id for e in events), reverse=True)
    html = response.content.decode()
    assert "tool call launched" in html and "<code>task.launched</code>" in html
    slow = history["slow"]
    assert f'href="{reverse("tasks:detail", args=[slow.id])}"' in html
    assert f'href="{reverse("servers:detail", args=[history["demo"].id])}">demo</a>' in html
    assert "tool: </dt>" not in html and "<dt>tool</dt><dd>slow_compute</dd>" in html


def test_filter_by_action(as_admin, history):
    response = as_admin.get(LIST, {"action": "task.launched"})
    assert shown_actions(response) == ["task.launched"] * 3
    assert 'value="task.launched" selected' in response.content.decode()


def test_the_action_select_lists_the_registry_with_descriptions(as_admin):
    html = as_admin.get(LIST).content.decode()
    assert '<option value="task.launched">tool call launched (task.launched)</option>' in html
    assert '<option value="audit.exported">audit trail exported (audit.exported)</option>' in html
    assert '<optgroup label="Input requests">' in html


def test_filter_by_actor_contains_and_exact(as_admin, history):
    contains = shown_actions(as_admin.get(LIST, {"actor": "LG"}))
    assert contains == ["task.launched", "task.launched"]  # olga
    assert shown_actions(as_admin.get(LIST, {"actor": "ol", "actor_exact": "on"})) == []
    exact = as_admin.get(LIST, {"actor": "olga", "actor_exact": "on"})
    assert shown_actions(exact) == contains
    assert {e.actor_label for e in as_admin.get(LIST, {"actor": "work"}).context["page"]} == {"worker"}


def test_filter_by_server(as_admin, history):
    reports = history["reports"]
    response = as_admin.get(LIST, {"server": reports.id})
    assert {e.server_id for e in response.context["page"]} == {reports.id}
    assert len(response.context["page"].object_list) == 5


def test_filter_by_task(as_admin, history):
    slow = history["slow"]
    response = as_admin.get(LIST, {"task": str(slow.id)})
    assert shown_actions(response) == ["task.status_changed", "task.launch_answered", "task.launched"]
    # Surrounding spaces from a paste are fine.
    assert shown_actions(as_admin.get(LIST, {"task": f"  {slow.id} "})) == shown_actions(response)


def test_filter_by_time_range_dates_and_datetimes(as_admin, admin):
    def at(text):
        with transaction.atomic():
            return AuditEvent.objects.create(
                time=datetime.datetime.fromisoformat(text).replace(tzinfo=UTC),
                actor_label="alex",
                action="server.updated",
            )

    early, mid, late = at("2026-11-01T09:00"), at("2026-11-02T23:59:30"), at("2026-11-03T00:00")
    ids = lambda r: [e.id for e in r.context["page"]]  # noqa: E731
    assert ids(as_admin.get(LIST, {"since": "2026-11-02"})) == [late.id, mid.id]
    assert ids(as_admin.get(LIST, {"until": "2026-11-02"})) == [mid.id, early.id]  # the whole day
    assert ids(as_admin.get(LIST, {"since": "2026-11-01T09:00", "until": "2026-11-02T12:00"})) == [early.id]
    assert ids(as_admin.get(LIST, {"since": "2026-11-02T23:59:30", "until": "2026-11-02T23:59:30"})) == [mid.id]


def test_free_text_searches_actor_action_description_and_data(as_admin, history):
    assert shown_actions(as_admin.get(LIST, {"q": "Budget service"})) == ["task.status_changed"]
    assert shown_actions(as_admin.get(LIST, {"q": "protocol"})) == ["task.protocol_error"]
    assert shown_actions(as_admin.get(LIST, {"q": "contradicts the protocol"})) == ["task.protocol_error"]
    assert len(as_admin.get(LIST, {"q": "OLGA"}).context["page"].object_list) == 2
    assert shown_actions(as_admin.get(LIST, {"q": "Q3"})) == ["task.launched"]


def test_filters_combine(as_admin, history):
    response = as_admin.get(LIST, {"server": history["demo"].id, "action": "task.status_changed", "q": "completed"})
    events = list(response.context["page"])
    assert [(e.task_id, e.data["to"]) for e in events] == [(history["slow"].id, "completed")]
    assert shown_actions(as_admin.get(LIST, {"actor": "olga", "server": history["reports"].id})) == []
    assert "No events match these filters." in as_admin.get(LIST, {"q": "nothing-like-this"}).content.decode()


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        ({"task": "not-a-uuid"}, "task", "“not-a-uuid” is not a task id"),
        ({"action": "task.teleported"}, "action", "“task.teleported” is not an audit action taskhub records"),
        ({"server": "99999"}, "server", "That server does not exist"),
        ({"server": "abc"}, "server", "That server does not exist"),
        ({"since": "yesterday"}, "since", "“yesterday” is not a date or time"),
        ({"until": "2026-13-40"}, "until", "is not a date or time"),
        ({"since": "2026-11-05", "until": "2026-11-01"}, "until", "“To” is before “From”"),
    ],
)
def test_bad_filters_give_a_clear_message_and_no_events(as_admin, history, params, field, message):
    response = as_admin.get(LIST, params)
    assert response.status_code == 200
    assert message in " ".join(response.context["form"].errors[field])
    html = response.content.decode()
    assert "Some filters could not be used, so no events are shown" in html
    assert 'class="field has-error' in html
    assert list(response.context["page"].object_list) == []
    assert "audit-table" not in html and "Export" not in html
    # The export refuses the same filters instead of widening to everything, and records nothing.
    export = as_admin.get(CSV, params)
    assert export.status_code == 400
    assert "Nothing exported: the filters are not valid." in export.content.decode()
    assert not AuditEvent.objects.filter(action="audit.exported").exists()


def test_pagination_keeps_the_filters(as_admin, admin):
    with transaction.atomic():
        for number in range(205):
            record_event(action="server.updated", user=admin, data={"n": number})
        record_event(action="server.created", user=admin, data={"n": "other"})
    first = as_admin.get(LIST, {"action": "server.updated"})
    page = first.context["page"]
    assert (page.paginator.count, page.paginator.num_pages, len(page.object_list)) == (205, 3, 100)
    assert [e.data["n"] for e in page.object_list][:2] == [204, 203]
    html = first.content.decode()
    assert 'href="?action=server.updated&amp;made_by=all&amp;page=2"' in html and "Page 1 of 3" in html
    last = as_admin.get(LIST, {"action": "server.updated", "page": "3"})
    assert [e.data["n"] for e in last.context["page"].object_list] == [4, 3, 2, 1, 0]
    assert 'href="?action=server.updated&amp;made_by=all&amp;page=2"' in last.content.decode()
    # A page number out of range or not a number shows the last or first page, not an error.
    assert as_admin.get(LIST, {"action": "server.updated", "page": "99"}).context["page"].number == 3
    assert as_admin.get(LIST, {"action": "server.updated", "page": "x"}).context["page"].number == 1


def test_htmx_gets_only_the_filtered_part(as_admin, history):
    response = as_admin.get(LIST, {"action": "task.launched"}, headers={"HX-Request": "true"})
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="audit" class="audit">')
    assert "<html" not in html and "<h1>Audit trail</h1>" not in html
    assert html.count("<tr data-action=") == 3


def test_export_links_carry_the_current_filters(as_admin, history):
    html = as_admin.get(LIST, {"action": "task.launched", "actor": "olga", "task": "", "page": "1"}).content.decode()
    assert f'href="{CSV}?action=task.launched&amp;actor=olga&amp;made_by=all"' in html
    assert f'href="{JSON}?action=task.launched&amp;actor=olga&amp;made_by=all"' in html
    assert "Export these 2" in html


def test_hostile_data_is_shown_literally_and_long_values_are_capped(as_admin, history):
    html = as_admin.get(LIST, {"action": "task.protocol_error"}).content.decode()
    assert SCRIPT not in html
    assert "&lt;script&gt;document.title=&#x27;pwned&#x27;&lt;/script&gt;" in html
    assert "x" * 159 + "…" in html and "x" * 161 not in html.split("<details")[0]
    assert '<details class="audit-full"><summary>all details</summary>' in html


def test_odd_data_shapes_render(as_admin, admin):
    with transaction.atomic():
        record_event(action="server.updated", user=admin, data={"nested": {"a": [1, 2]}, "n": None})
        AuditEvent.objects.create(actor_label="x", action="server.updated", data=["a", "<b>"])
        AuditEvent.objects.create(actor_label="x", action="server.updated", data="just text")
        AuditEvent.objects.create(actor_label="x", action="server.updated", data={f"k{i}": i for i in range(12)})
    html = as_admin.get(LIST).content.decode()
    assert "<dd>{&quot;a&quot;: [1, 2]}</dd>" in html and "<dd>null</dd>" in html
    assert "[&quot;a&quot;, &quot;&lt;b&gt;&quot;]" in html and "just text" in html
    assert "+4 more" in html


# --- export --------------------------------------------------------------------------------------------


def test_csv_export_has_a_header_and_exactly_the_filtered_rows(as_admin, history):
    params = {"server": history["demo"].id, "action": "task.status_changed"}
    response = as_admin.get(CSV, params)
    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"].startswith('attachment; filename="taskhub-audit-')
    assert response["Content-Disposition"].endswith('Z.csv"')
    rows = list(csv.DictReader(io.StringIO(body(response))))
    expected = list(filtered_events({"made_by": "all", **params})[1].exclude(action="audit.exported"))
    assert [int(row["id"]) for row in rows] == [e.id for e in expected] and len(rows) == 2
    first, event = rows[0], expected[0]
    assert list(first) == [
        "id",
        "time",
        "actor_label",
        "actor_id",
        "action",
        "description",
        "task_id",
        "server_id",
        "seq",
        "prev_hash",
        "hash",
        "data",
    ]
    assert first["time"] == event.time.astimezone(UTC).isoformat().replace("+00:00", "Z")
    assert (first["actor_label"], first["actor_id"], first["action"]) == ("worker", "", "task.status_changed")
    assert first["description"] == "task status changed"
    assert (first["task_id"], first["server_id"]) == (str(event.task_id), str(history["demo"].id))
    assert json.loads(first["data"]) == event.data
    assert first["hash"] == bytes(AuditEvent.objects.get(pk=event.pk).hash).hex()  # the chain goes with it
    assert response["X-Audit-Rows"] == "2"


def test_csv_cells_that_a_spreadsheet_would_run_are_defused(as_admin, history):
    rows = list(csv.DictReader(io.StringIO(body(as_admin.get(CSV, {"action": "server.unreachable"})))))
    assert len(rows) == 1
    assert rows[0]["actor_label"] == '\'=HYPERLINK("http://evil")'
    assert json.loads(rows[0]["data"]) == {"error": "-2+3", "note": "@SUM(A1:A9)"}  # starts with "{": harmless
    with transaction.atomic():
        record_event(action="server.updated", actor_label="+1", data="@x")  # type: ignore[arg-type]
        record_event(action="server.updated", actor_label="-1", data={})
        record_event(action="server.updated", actor_label="@me", data={})
    labels = [row["actor_label"] for row in csv.DictReader(io.StringIO(body(as_admin.get(CSV, {"actor": "1"}))))]
    assert sorted(labels) == ["'+1", "'-1"]
    row = next(csv.DictReader(io.StringIO(body(as_admin.get(CSV, {"actor": "@me"})))))
    assert row["actor_label"] == "'@me"


def test_json_export_parses_and_matches_the_filtered_rows(as_admin, history, admin):
    params = {"actor": "alex", "actor_exact": "on"}
    response = as_admin.get(JSON, params)
    assert response["Content-Type"] == "application/json"
    assert response["Content-Disposition"].endswith('Z.json"')
    rows = json.loads(body(response))
    expected = list(filtered_events({"made_by": "all", **params})[1].exclude(action="audit.exported"))
    assert [row["id"] for row in rows] == [e.id for e in expected] and len(rows) == 3
    launched = next(row for row in rows if row["action"] == "task.launched")
    assert launched["data"] == {"tool": "build_report", "arguments": {"quarter": "Q3"}, "server": "reports"}
    assert (launched["actor_id"], launched["server_id"]) == (admin.id, history["reports"].id)
    assert launched["task_id"] == str(history["report"].id)
    assert tuple(launched) == EXPORT_COLUMNS


def test_the_recorded_filters_are_the_ones_in_use(as_admin, history):
    body(as_admin.get(JSON, {"actor": "olga", "actor_exact": "on", "since": "2026-01-01", "task": ""}))
    body(as_admin.get(JSON, {"actor": "", "actor_exact": "on"}))
    first, second = AuditEvent.objects.filter(action="audit.exported").order_by("id")
    assert first.data["filters"] == {
        "made_by": "all",
        "actor": "olga",
        "actor_exact": True,
        "since": "2026-01-01T00:00:00+00:00",
    }
    assert (first.data["format"], first.data["rows"]) == ("json", 2)
    assert second.data["filters"] == {"made_by": "all"}


def test_an_empty_json_export_is_an_empty_array(as_admin):
    assert json.loads(body(as_admin.get(JSON, {"q": "nothing"}))) == []


def test_the_export_is_recorded_with_its_filters_and_row_count(as_admin, history, admin):
    before = AuditEvent.objects.count()
    body(as_admin.get(CSV, {"server": history["reports"].id, "q": "report"}))
    event = AuditEvent.objects.get(action="audit.exported")
    assert (event.actor_id, event.actor_label) == (admin.id, "alex")
    assert event.data["format"] == "csv"
    assert event.data["filters"] == {"made_by": "all", "server": f"{history['reports'].id} (reports)", "q": "report"}
    assert event.data["rows"] == 2
    assert event.data["up_to_event"] == AuditEvent.objects.filter(id__lt=event.id).latest("id").id
    assert AuditEvent.objects.count() == before + 1
    # The next export sees the first one, and the page lists it.
    rows = json.loads(body(as_admin.get(JSON, {"action": "audit.exported"})))
    assert [row["id"] for row in rows] == [event.id]
    assert "audit trail exported" in as_admin.get(LIST, {"action": "audit.exported"}).content.decode()


# --- the Django admin -----------------------------------------------------------------------------------


@pytest.fixture
def superuser_client(client):
    client.force_login(make_user("root", is_superuser=True, is_staff=True))
    return client


def test_the_admin_lists_and_shows_events_read_only(superuser_client, history):
    listing = superuser_client.get("/admin/audit/auditevent/", {"q": "olga"})
    assert listing.status_code == 200
    html = listing.content.decode()
    assert "tool call launched" in html and 'name="action"' not in html and "Add audit event" not in html
    event = AuditEvent.objects.get(action="task.protocol_error")
    page = superuser_client.get(f"/admin/audit/auditevent/{event.id}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "View audit event" in html and 'name="_save"' not in html and "Delete" not in html
    assert SCRIPT not in html and "&lt;script&gt;" in html
    assert superuser_client.get("/admin/audit/auditevent/add/").status_code == 403


def test_admin_posts_to_change_or_delete_are_refused_and_change_nothing(superuser_client, history):
    event = AuditEvent.objects.get(action="task.launched", actor_label="alex")
    before = (event.actor_label, event.action, event.data)
    change = superuser_client.post(
        f"/admin/audit/auditevent/{event.id}/change/",
        {"actor_label": "mallory", "action": "server.created", "data": "{}", "time_0": "2020-01-01", "time_1": "00:00"},
    )
    assert change.status_code == 403
    delete = superuser_client.post(f"/admin/audit/auditevent/{event.id}/delete/", {"post": "yes"})
    assert delete.status_code == 403
    bulk = superuser_client.post(
        "/admin/audit/auditevent/", {"action": "delete_selected", "_selected_action": [event.id], "post": "yes"}
    )
    assert bulk.status_code in (200, 302)
    event.refresh_from_db()
    assert (event.actor_label, event.action, event.data) == before
    assert AuditEvent.objects.filter(pk=event.pk).exists()


def test_the_database_trigger_is_the_last_line_even_if_the_admin_let_it_through(history, rf):
    """An admin subclass that forgot the permission overrides still cannot change or delete a row."""
    from django.contrib.admin.sites import site

    model_admin = AuditEventAdmin(AuditEvent, site)
    request = rf.post("/")
    event = AuditEvent.objects.get(action="task.launched", actor_label="alex")
    event.actor_label = "mallory"
    with pytest.raises(DatabaseError, match="append-only: UPDATE refused"), transaction.atomic():
        model_admin.save_model(request, event, form=None, change=True)
    with pytest.raises(DatabaseError, match="append-only: DELETE refused"), transaction.atomic():
        model_admin.delete_model(request, event)
    with pytest.raises(DatabaseError, match="append-only: DELETE refused"), transaction.atomic():
        model_admin.delete_queryset(request, AuditEvent.objects.all())
    event.refresh_from_db()
    assert event.actor_label == "alex"


def test_no_one_gets_a_bulk_delete_action(superuser_client, rf, history):
    from django.contrib.admin.sites import site

    request = rf.get("/admin/audit/auditevent/")
    request.user = make_user("boss", is_superuser=True, is_staff=True)
    model_admin = AuditEventAdmin(AuditEvent, site)
    assert model_admin.get_actions(request) == {}
    assert not model_admin.has_add_permission(request)
    assert not model_admin.has_change_permission(request, AuditEvent.objects.first())
    assert not model_admin.has_delete_permission(request, AuditEvent.objects.first())
    assert model_admin.has_view_permission(request)


def test_a_uuid_that_matches_no_task_is_fine(as_admin, history):
    response = as_admin.get(LIST, {"task": str(uuid.uuid4())})
    assert response.context["form"].is_valid() and list(response.context["page"].object_list) == []


def test_the_page_shows_peoples_actions_unless_asked_for_taskhubs_own_one_click_away(client, admin, history):
    client.force_login(admin)
    response = client.get(LIST)
    shown = list(response.context["page"].object_list)
    assert shown and all(event.actor_id is not None for event in shown)
    assert {event.actor_label for event in shown} == {"alex", "olga"}
    html = response.content.decode()
    assert 'href="?made_by=system"' in html and 'href="?made_by=all"' in html
    system = client.get(LIST, {"made_by": "system"}).context["page"].object_list
    assert system and all(event.actor_id is None for event in system)
    everything = client.get(LIST, {"made_by": "all", "action": "task.launched"})
    assert 'href="?made_by=people&amp;action=task.launched"' in everything.content.decode()
