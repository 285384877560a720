"""Issue 34, item 2: one definition of "waiting for me" (taskhub/tasks/waiting.py), counted the same by the nav's
Inbox badge, the tab title, Home, the inbox and GET /api/inbox. An admin who approves, but is not on a tool's policy,
saw "Inbox 8" in the nav and "(8)" in the title while Home said 6 and the inbox showed 6 cards."""

import re

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from taskhub.accounts.groups import ADMINS, APPROVERS
from taskhub.api.tokens import create_token
from taskhub.approvals.services import create_policy
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks.models import InputRequest
from taskhub.tasks.waiting import waiting_count
from tests.account_fixtures import make_user
from tests.inbox_fixtures import task_asking

pytestmark = pytest.mark.django_db

ASK = {"method": "elicitation/create", "params": {"message": "Go?", "requestedSchema": {"type": "object"}}}


def server(name: str) -> Server:
    return create_server(name=name, transport="http", url=f"http://127.0.0.1:9/{name}", user=None)


def test_the_nav_the_title_home_the_inbox_and_the_api_count_the_same_requests():
    alex = make_user("alex", ADMINS, APPROVERS)
    demo, off, escalating = server("demo"), server("off"), server("escalating")
    # A tool's policy names finance, which alex is not in: its two requests are not his to answer.
    create_policy(server=demo, tool="approval", groups=[Group.objects.create(name="finance")], user=None)
    task_asking(demo, {"a": ASK, "b": ASK}, tool="approval")
    task_asking(demo, {"a": ASK, "b": ASK, "c": ASK}, tool="deploy")  # 3 waiting for him
    task_asking(off, {"a": ASK}, tool="deploy")
    Server.objects.filter(pk=off.pk).update(enabled=False)  # a disabled server's request: not waiting
    escalated = task_asking(escalating, {"a": ASK, "b": ASK}, tool="deploy")  # 1 waiting, 1 handed to on-call
    InputRequest.objects.filter(task=escalated, key="a").update(escalated_to=Group.objects.create(name="oncall"))
    expected = 4

    client = Client()
    client.force_login(alex)
    page = client.get("/").content.decode()
    assert re.search(r'id="nav-inbox-count"[^>]*>(\d+)</span>', page).group(1) == str(expected)
    assert re.search(r"<title>\((\d+)\)", page).group(1) == str(expected)
    assert re.search(rf'data-count="{expected}">{expected}</a> open requests', page)

    inbox = client.get("/inbox/").content.decode()
    assert len(re.findall(r'<article class="ir-card', inbox)) == expected
    _, secret = create_token(user=alex, name="tests")
    listed = Client(headers={"Authorization": f"Bearer {secret}"}).get("/api/inbox").json()
    assert listed["count"] + sum(group["count"] for group in listed["grouped"]) == expected
    assert listed["hidden_disabled"] == 1

    # The fast path (the kept per-server counts) where the rules refuse alex nothing, one by one elsewhere.
    other = server("other")
    task_asking(other, {"a": ASK}, tool="deploy")
    assert waiting_count(alex) == expected + 1


def test_a_page_reads_the_approval_policies_once_however_often_it_asks_what_they_leave_a_person():
    """Home asks which servers and requests the policies leave its reader for its panels and for the nav's count, and
    the inbox asks again for its cards: the policies and the reader's groups are read once per request
    (accounts.permissions.read_once), not once per question."""
    alex = make_user("alex", ADMINS, APPROVERS)
    demo = server("demo")
    create_policy(server=demo, tool="approval", groups=[Group.objects.create(name="finance")], user=None)
    task_asking(demo, {"a": ASK}, tool="deploy")
    task_asking(server("plain"), {"a": ASK}, tool="deploy")  # counted from the kept per-server counts
    client = Client()
    client.force_login(alex)
    for path in ("/", "/inbox/"):
        client.get(path)
        with CaptureQueriesContext(connection) as queries:
            assert client.get(path).status_code == 200
        # The policies with whether each names the reader (approvals.rules._policies_for).
        policy_reads = [
            q["sql"] for q in queries if 'NOT EXISTS (SELECT 1 FROM "approvals_approvalpolicy_groups"' in q["sql"]
        ]
        assert len(policy_reads) == 1, (path, len(policy_reads))
        # Home's "waiting for me" is the nav's count too: counted once (the open requests' kept counts read once);
        # the unfiltered inbox's nav count is its listing's (InboxListing.waiting), no kept count read.
        counts_reads = [q["sql"] for q in queries if "FROM observability_inputrequeststatedelta" in q["sql"]]
        assert len(counts_reads) == {"/": 1, "/inbox/": 0}[path], (path, len(counts_reads))
    for path in ("/", "/inbox/", "/tasks/"):
        # The servers the reader approves for, and which are enabled: read once (permissions.approvable_servers) for
        # the nav's access, its count, the inbox's listing, the list's counts and Home's trends.
        with CaptureQueriesContext(connection) as queries:
            assert client.get(path).status_code == 200
        server_reads = [q["sql"] for q in queries if q["sql"].startswith('SELECT "servers_server"."id" AS "pk"')]
        assert len(server_reads) == 1, (path, server_reads)
