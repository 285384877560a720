"""One server cannot flood the inbox (issue 14, point 4): pages, filters, grouped floods, disabled servers, the cap.

taskhub/tasks/inbox_listing.py (the page and GET /api/inbox) and the cap in taskhub/tasks/services/following.py.
"""

import re

import pytest
from django.contrib.auth.models import Group
from django.test import Client

from taskhub.accounts.groups import ADMINS, APPROVERS
from taskhub.api.tokens import create_token
from taskhub.audit.models import AuditEvent
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.inbox_listing import FLOOD_THRESHOLD
from taskhub.tasks.models import InputRequest, InputRequestState
from taskhub.tasks.waiting import waiting_count
from tests.account_fixtures import make_user
from tests.approval_fixtures import add_approver_groups
from tests.catalogue_fixtures import with_tools
from tests.helpers import snapshot
from tests.inbox_fixtures import remote_id, task_asking

pytestmark = pytest.mark.django_db

ASK = {
    "method": "elicitation/create",
    "params": {
        "message": "Approve?",
        "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
    },
}
FLOOD_SIZE = 2000
CARD_ID = re.compile(r'id="ir-(\d+)"')


@pytest.fixture
def servers():
    team = Group.objects.create(name="team")
    made = []
    for name in ("flooder", "quiet", "other"):
        server = create_server(name=name, transport="http", url=f"http://{name}.example/mcp", user=None)
        add_approver_groups(server, team)
        made.append(server)
    return made


@pytest.fixture
def approver(servers):
    return make_user("ada", APPROVERS, "team")


def pages(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def api(user) -> Client:
    _, secret = create_token(user=user, name="tests")
    return Client(headers={"Authorization": f"Bearer {secret}"})


def flood(server, count: int) -> list[int]:
    """`count` open requests of one task of `server`, the first through the services, the rest in bulk."""
    task = task_asking(server, {"k0": ASK})
    InputRequest.objects.bulk_create(
        InputRequest(task=task, server=server, key=f"k{n}", method="elicitation/create", params=ASK["params"])
        for n in range(1, count)
    )
    return list(InputRequest.objects.filter(task=task).values_list("pk", flat=True))


def card_ids(html: str) -> list[int]:
    return [int(pk) for pk in CARD_ID.findall(html)]


def open_ids(task) -> list[int]:
    return list(task.input_requests.filter(state=InputRequestState.OPEN).values_list("pk", flat=True))


# --- the flood ---------------------------------------------------------------------------------------------


def test_a_flood_from_one_server_leaves_the_others_requests_on_the_first_page(servers, approver):
    flooder, quiet, _ = servers
    flood(flooder, FLOOD_SIZE)
    few = [pk for n in range(3) for pk in open_ids(task_asking(quiet, {f"q{n}": ASK}))]

    html = pages(approver).get("/inbox/").content.decode()
    assert card_ids(html) == few
    assert f"{FLOOD_SIZE} open requests from <strong>flooder</strong>" in html
    assert f'href="/inbox/?server={flooder.pk}">show them</a>' in html
    # The nav's badge: every request waiting, the flood's too, as the listing counted them (not counted again).
    assert f'aria-label="open requests" data-approver="yes">{FLOOD_SIZE + 3}</span>' in html
    assert waiting_count(approver) == FLOOD_SIZE + 3

    body = api(approver).get("/api/inbox").json()
    assert [row["id"] for row in body["results"]] == few
    assert body["grouped"] == [{"server": "flooder", "server_id": flooder.pk, "count": FLOOD_SIZE}]

    # "show them": that server's requests, a page at a time.
    shown = pages(approver).get(f"/inbox/?server={flooder.pk}").content.decode()
    assert len(card_ids(shown)) == 50 and "Page 1 of 40" in shown
    assert api(approver).get("/api/inbox?server=flooder&page=40").json()["count"] == FLOOD_SIZE


def test_a_server_alone_in_the_inbox_is_listed_not_grouped(servers, approver):
    flooder = servers[0]
    ids = flood(flooder, FLOOD_THRESHOLD + 5)
    html = pages(approver).get("/inbox/").content.decode()
    assert card_ids(html) == sorted(ids)
    assert "are grouped here" not in html


# --- pages and filters -------------------------------------------------------------------------------------


def test_the_inbox_pages_and_keeps_its_filters_across_pages(servers, approver):
    flooder, quiet, _ = servers
    deploys = open_ids(task_asking(flooder, {f"d{n}": ASK for n in range(60)}, tool="deploy"))
    task_asking(flooder, {"b": ASK}, tool="backup")
    task_asking(quiet, {"q": ASK}, tool="deploy")
    client = pages(approver)

    first = client.get(f"/inbox/?server={flooder.pk}&tool=deploy").content.decode()
    assert card_ids(first) == sorted(deploys)[:50]
    assert f'href="/inbox/?server={flooder.pk}&amp;tool=deploy&amp;page=2"' in first
    # The live re-fetch asks for the same filters and page.
    assert f'data-cards-url="/inbox/?server={flooder.pk}&amp;tool=deploy&amp;fragment=cards"' in first

    second = client.get(f"/inbox/?server={flooder.pk}&tool=deploy&page=2").content.decode()
    assert card_ids(second) == sorted(deploys)[50:]
    assert "Page 2 of 2" in second
    assert f'data-cards-url="/inbox/?server={flooder.pk}&amp;tool=deploy&amp;page=2&amp;fragment=cards"' in second
    fragment = client.get(f"/inbox/?server={flooder.pk}&tool=deploy&page=2&fragment=cards").content.decode()
    assert card_ids(fragment) == sorted(deploys)[50:]

    body = api(approver).get(f"/api/inbox?server={flooder.pk}&tool=deploy&page=2&page_size=50").json()
    assert [row["id"] for row in body["results"]] == sorted(deploys)[50:]
    assert (body["count"], body["page"], body["pages"]) == (60, 2, 2)


NO_SUCH_SERVER = "There is no server with that id among those you approve for."


@pytest.mark.parametrize(
    ("query", "page_says", "api_says"),
    [
        ("server=abc", NO_SUCH_SERVER, "You approve for no server 'abc'."),
        ("server=99999", NO_SUCH_SERVER, NO_SUCH_SERVER),
        ("page=0", "Pages are numbered from 1.", "Pages are numbered from 1."),
        ("page=x", "The page must be a whole number", "valid integer"),
        ("page=9", "There is no page 9: one page of requests match.", "There is no page 9"),
        ("page_size=500", None, "Between 1 and 200."),
    ],
)
def test_filters_that_do_not_fit_say_so(servers, approver, query, page_says, api_says):
    task_asking(servers[0], {"a": ASK})
    if page_says:
        assert page_says in pages(approver).get(f"/inbox/?{query}").content.decode()
    response = api(approver).get(f"/api/inbox?{query}")
    assert response.status_code == 400
    assert api_says in " ".join(response.json()["fields"].values())


# --- disabled servers ------------------------------------------------------------------------------------


def test_requests_of_disabled_servers_are_hidden_unless_asked_for(servers, approver):
    flooder, quiet, _ = servers
    kept = open_ids(task_asking(quiet, {"q": ASK}))
    hidden = open_ids(task_asking(flooder, {"a": ASK, "b": ASK}))
    Server.objects.filter(pk=flooder.pk).update(enabled=False)
    client = pages(approver)

    html = client.get("/inbox/").content.decode()
    assert card_ids(html) == kept
    assert "2 open requests from disabled servers are hidden" in html
    assert 'aria-label="open requests" data-approver="yes">1</span>' in html  # a disabled server's are not waiting
    filtered = client.get("/inbox/?disabled=1").content.decode()  # counted by the nav itself
    assert 'aria-label="open requests" data-approver="yes">1</span>' in filtered
    assert sorted(card_ids(client.get("/inbox/?disabled=1").content.decode())) == sorted(kept + hidden)

    assert [row["id"] for row in api(approver).get("/api/inbox").json()["results"]] == kept
    assert api(approver).get("/api/inbox").json()["hidden_disabled"] == 2
    shown = api(approver).get("/api/inbox?disabled=true").json()["results"]
    assert sorted(row["id"] for row in shown) == sorted(kept + hidden)


# --- the cap ---------------------------------------------------------------------------------------------


def cap_events(task):
    return AuditEvent.objects.filter(task=task, action="task.protocol_error", data__has_key="open_request_cap")


def test_past_its_cap_a_server_opens_no_more_requests_and_is_flagged(servers, settings):
    settings.TASKHUB_MAX_OPEN_REQUESTS_PER_SERVER = 3
    flooder, quiet, _ = servers
    first = task_asking(flooder, {f"k{n}": ASK for n in range(5)})
    assert len(open_ids(first)) == 3
    assert cap_events(first).count() == 1

    # The same snapshot again: still no new rows, and the timeline does not repeat itself.
    again = snapshot("input_required", task_id=remote_id(first), inputRequests={f"k{n}": ASK for n in range(5)})
    services.apply_snapshot(task=first, snapshot=again)
    assert len(open_ids(first)) == 3 and cap_events(first).count() == 1

    second = task_asking(flooder, {"x": ASK})
    assert open_ids(second) == [] and cap_events(second).count() == 1
    assert len(open_ids(task_asking(quiet, {"x": ASK}))) == 1  # other servers are not held back

    flooder.refresh_from_db()
    assert "over its open-request cap" in flooder.last_error
    admin = make_user("root", ADMINS)
    assert "over its open-request cap" in pages(admin).get(f"/servers/{flooder.pk}/").content.decode()

    # Room again once some are answered: the next snapshot opens what was held back.
    answered = InputRequest.objects.filter(task=first).order_by("pk")[:2]
    InputRequest.objects.filter(pk__in=list(answered.values_list("pk", flat=True))).update(
        state=InputRequestState.DELIVERED
    )
    services.apply_snapshot(task=first, snapshot=again)
    assert InputRequest.objects.filter(task=first).count() == 5


def test_the_openapi_document_describes_the_inbox_pages_and_filters(approver):
    document = api(approver).get("/api/openapi.json").json()
    inbox = document["paths"]["/api/inbox"]["get"]
    assert {p["name"] for p in inbox["parameters"]} == {"server", "tool", "disabled", "mine", "page", "page_size"}
    assert all(p["schema"].get("description") or p.get("description") for p in inbox["parameters"])
    page = inbox["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    assert {"count", "page", "pages", "results", "grouped", "hidden_disabled"} <= set(
        document["components"]["schemas"][page]["properties"]
    )
    assert "400" in inbox["responses"]


def test_a_plain_post_answer_returns_to_the_same_filtered_page(servers, approver):
    flooder, quiet, _ = servers
    task = task_asking(flooder, {f"d{n}": ASK for n in range(55)})
    task_asking(quiet, {"q": ASK})
    client = pages(approver)
    html = client.get(f"/inbox/?server={flooder.pk}&page=2").content.decode()
    back = f"/inbox/?server={flooder.pk}&amp;page=2"
    assert f'name="next" value="{back}"' in html
    last = max(open_ids(task))
    answered = client.post(f"/inbox/{last}/answer", {"action": "decline", "next": back.replace("&amp;", "&")})
    assert answered.status_code == 302 and answered["Location"] == back.replace("&amp;", "&")
    # A refused plain POST shows the same filtered page, with the card and the reason.
    refused = client.post(f"/inbox/{last}/answer", {"action": "decline", "next": back.replace("&amp;", "&")})
    assert refused.status_code == 409
    body = refused.content.decode()
    assert "Page 2 of 2" in body and f'<option value="{flooder.pk}" selected>' in body


@pytest.mark.django_db(transaction=True)
def test_the_cap_holds_when_many_tasks_of_a_server_open_requests_at_once(settings):
    """Issue 31, point 7: counted without a lock, 8 tasks x 400 requests opened at once against a cap of 1,000 left
    2,400 open. Each thread applies its task's snapshot in its own transaction, all released together."""
    import threading

    from django.db import connection

    from taskhub.mcp.client import TaskCreated

    settings.TASKHUB_MAX_OPEN_REQUESTS_PER_SERVER = 40
    server = create_server(name="flooder", transport="http", url="http://flood.example/mcp", user=None)
    tasks = []
    for _ in range(6):
        task = services.launch(server=with_tools(server, "deploy"), tool="deploy", arguments={}, user=None)
        tasks.append(
            services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot(task_id=remote_id(task))))
        )
    start = threading.Barrier(len(tasks))
    failures = []

    def open_requests(task) -> None:
        try:
            asking = snapshot(
                "input_required", task_id=remote_id(task), inputRequests={f"k{n}": ASK for n in range(20)}
            )
            start.wait(10)
            services.apply_snapshot(task=task, snapshot=asking)
        except Exception as error:
            failures.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=open_requests, args=(task,)) for task in tasks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == []
    assert InputRequest.objects.filter(server=server, state=InputRequestState.OPEN).count() == 40
