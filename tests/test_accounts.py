"""Roles and what they allow (taskhub/accounts/permissions.py), the role groups, and the sign-in pages."""

import re

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import AnonymousUser, Group
from django.core.exceptions import PermissionDenied
from django.db import connections
from django.http import HttpResponse
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import path, reverse
from django.views import View

from taskhub import urls as project_urls
from taskhub.accounts import permissions
from taskhub.accounts.groups import ADMINS, AGENTS, APPROVERS, OPERATORS, ROLE_GROUPS
from taskhub.servers.models import Server, Transport
from taskhub.tasks.models import InputRequest, Task
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.approval_fixtures import add_approver_groups

pytestmark = pytest.mark.django_db

PEOPLE = ("anonymous", "approver", "foreign_approver", "operator", "admin", "superuser", "nobody", "agent")


@pytest.fixture
def servers():
    """`open` has no approver groups; `finance` only lets its own group approve."""
    finance_group = Group.objects.create(name="finance")
    open_server = Server.objects.create(name="open", transport=Transport.HTTP, url="http://open.example/mcp")
    finance = Server.objects.create(name="finance", transport=Transport.HTTP, url="http://finance.example/mcp")
    add_approver_groups(finance, finance_group)
    return {"open": open_server, "finance": finance}


@pytest.fixture
def people(servers):
    finance_approver = make_user("fiona", APPROVERS, "finance")
    return {
        "anonymous": AnonymousUser(),
        "approver": finance_approver,  # approves for `finance`, and for `open` like every approver
        "foreign_approver": make_user("ada", APPROVERS, "legal"),  # an approver, not in finance's group
        "operator": make_user("olga", OPERATORS),
        "admin": make_user("alex", ADMINS),
        "superuser": make_user("root", is_superuser=True, is_staff=True),
        "nobody": make_user("nils"),
        "agent": make_user("ci-bot", AGENTS),
    }


def input_request_on(server) -> InputRequest:
    task = Task.objects.create(server=server, tool="deploy")
    return InputRequest.objects.create(task=task, key="k", method="elicitation/create")


def test_the_migration_created_the_role_groups():
    assert set(Group.objects.filter(name__in=ROLE_GROUPS).values_list("name", flat=True)) == set(ROLE_GROUPS)


ROLE_TABLE = {
    # person: (is_approver, is_operator, is_admin)
    "anonymous": (False, False, False),
    "approver": (True, False, False),
    "foreign_approver": (True, False, False),
    "operator": (False, True, False),
    "admin": (False, True, True),
    "superuser": (False, True, True),
    "nobody": (False, False, False),
    "agent": (False, False, False),  # its own role, agent, below
}


@pytest.mark.parametrize("person", PEOPLE)
def test_roles(people, person):
    user = people[person]
    expected = ROLE_TABLE[person]
    assert (permissions.is_approver(user), permissions.is_operator(user), permissions.is_admin(user)) == expected
    roles = permissions.roles_of(user)
    assert (roles.approver, roles.operator, roles.admin) == expected
    assert roles.agent is permissions.is_agent(user) is (person == "agent")


@pytest.mark.parametrize(
    ("person", "may_approve"),
    [
        ("anonymous", set()),
        ("approver", {"open", "finance"}),
        ("foreign_approver", {"open"}),
        ("operator", set()),
        ("admin", set()),  # admins are not approvers unless also in `approvers`
        ("superuser", set()),
        ("nobody", set()),
        ("agent", set()),
    ],
)
def test_servers_user_may_approve_and_may_answer(people, servers, person, may_approve):
    user = people[person]
    assert set(permissions.servers_user_may_approve(user).values_list("name", flat=True)) == may_approve
    for name, server in servers.items():
        assert permissions.may_answer(user, input_request_on(server)) is (name in may_approve), name


def test_being_in_a_servers_approver_group_is_not_enough_without_the_approver_role(servers):
    finance_clerk = make_user("carl", "finance")
    assert not permissions.servers_user_may_approve(finance_clerk).exists()
    assert not permissions.may_answer(finance_clerk, input_request_on(servers["finance"]))


def test_an_admin_who_is_also_an_approver_may_answer(servers):
    admin_approver = make_user("abby", ADMINS, APPROVERS)
    assert permissions.may_answer(admin_approver, input_request_on(servers["open"]))
    assert not permissions.may_answer(admin_approver, input_request_on(servers["finance"]))


def test_a_server_listing_several_groups_lets_each_approve(servers):
    add_approver_groups(servers["finance"], Group.objects.create(name="audit"))
    auditor = make_user("otto", APPROVERS, "audit")
    assert permissions.may_answer(auditor, input_request_on(servers["finance"]))
    # one row per server however many of its groups the user shares
    both = make_user("bea", APPROVERS, "audit", "finance")
    assert list(permissions.servers_user_may_approve(both).values_list("name", flat=True)) == ["finance", "open"]


@pytest.mark.parametrize(
    ("person", "allowed"),
    [
        ("anonymous", False),
        ("approver", False),
        ("foreign_approver", False),
        ("operator", True),
        ("admin", True),
        ("superuser", True),
        ("nobody", False),
        ("agent", False),  # from the pages; through a token, below
    ],
)
def test_may_launch_and_may_cancel(people, servers, person, allowed):
    user = people[person]
    task = Task.objects.create(server=servers["open"], tool="deploy")
    assert permissions.may_launch(user, servers["open"]) is allowed
    assert permissions.may_cancel(user, task) is allowed


@pytest.mark.parametrize(
    ("person", "launches", "own", "others"),
    [
        # (may see, may cancel) its own task and another's, on `finance`, through a token.
        ("anonymous", False, (False, False), (False, False)),
        ("approver", False, (True, False), (True, False)),  # approves for finance: sees, never cancels
        ("foreign_approver", False, (False, False), (False, False)),
        ("operator", True, (True, True), (True, True)),
        ("admin", True, (True, True), (True, True)),
        ("nobody", False, (False, False), (False, False)),
        ("agent", True, (True, True), (False, False)),
    ],
)
def test_through_a_token_agents_launch_and_follow_and_cancel_their_own_tasks(
    people, servers, person, launches, own, others
):
    user = people[person]
    launcher = user if user.is_authenticated else None
    own_task = Task.objects.create(server=servers["finance"], tool="deploy", launched_by=launcher)
    others_task = Task.objects.create(server=servers["finance"], tool="deploy", launched_by=people["operator"])
    assert permissions.launches_through_token(user) is launches
    assert permissions.may_launch_through_token(user, servers["finance"]) is launches
    assert (permissions.may_see_task_through_token(user, own_task), permissions.may_cancel(user, own_task)) == own
    assert (
        permissions.may_see_task_through_token(user, others_task),
        permissions.may_cancel(user, others_task),
    ) == others
    if person == "agent":  # the pages are for people: an agent sees none of its tasks there
        assert not permissions.may_see_task(user, own_task)
        assert not permissions.may_launch_through_token(user, Server(name="off", enabled=False))


def test_nobody_may_launch_on_a_disabled_server(people, servers):
    servers["open"].enabled = False
    assert not permissions.may_launch(people["admin"], servers["open"])


def test_an_inactive_user_has_no_role(servers):
    retired = make_user("ria", APPROVERS, OPERATORS, ADMINS, is_active=False)
    assert permissions.roles_of(retired) == permissions.NO_ROLES
    assert not permissions.servers_user_may_approve(retired).exists()


def test_a_membership_change_is_seen_at_once(people):
    # no caching: a long-lived WebSocket connection keeps the same user object
    operator = people["operator"]
    assert permissions.is_operator(operator)
    operator.groups.clear()
    assert not permissions.is_operator(operator)


def test_a_page_reads_the_roles_once_and_the_next_request_reads_them_again(client, people):
    # The view, the filter form, the nav and the template all ask; one query answers them within the request.
    operator = people["operator"]
    client.force_login(operator)
    with CaptureQueriesContext(connections["default"]) as queries:
        assert client.get(reverse("tasks:list")).status_code == 200
    assert sum('FROM "auth_group"' in query["sql"] for query in queries.captured_queries) == 1
    operator.groups.clear()
    assert client.get(reverse("tasks:list")).status_code == 403
    assert permissions.roles_this_request.get() is None  # nothing is kept once the request is answered


# --- view guards -------------------------------------------------------------------------------------


def ok_view(request):
    return HttpResponse("ok")


async def async_ok_view(request):
    return HttpResponse("ok")


class OperatorPage(permissions.OperatorRequiredMixin, View):
    def get(self, request):
        return HttpResponse("ok")


class AdminPage(permissions.AdminRequiredMixin, View):
    def get(self, request):
        return HttpResponse("ok")


def call(view, user, path="/launch/?server=1"):
    request = RequestFactory().get(path)
    request.user = user

    async def auser():
        return user

    request.auser = auser
    return view(request)


GUARDED_VIEWS = {
    "operator_required": (permissions.operator_required(ok_view), {"operator", "admin", "superuser"}),
    "admin_required": (permissions.admin_required(ok_view), {"admin", "superuser"}),
    "approver_required": (permissions.approver_required(ok_view), {"approver", "foreign_approver"}),
    "OperatorRequiredMixin": (OperatorPage.as_view(), {"operator", "admin", "superuser"}),
    "AdminRequiredMixin": (AdminPage.as_view(), {"admin", "superuser"}),
}


@pytest.mark.parametrize("guard", GUARDED_VIEWS)
@pytest.mark.parametrize("person", PEOPLE)
def test_guards_admit_the_role_refuse_others_and_send_strangers_to_sign_in(people, guard, person):
    view, admitted = GUARDED_VIEWS[guard]
    if person == "anonymous":
        response = call(view, people[person])
        assert response.status_code == 302
        assert response["Location"] == "/accounts/login/?next=/launch/%3Fserver%3D1"
    elif person in admitted:
        assert call(view, people[person]).content == b"ok"
    else:
        with pytest.raises(PermissionDenied, match="This page is for"):
            call(view, people[person])


@pytest.mark.django_db(transaction=True)  # the role check runs in another thread, outside the test's transaction
async def test_guards_wrap_async_views_too():
    view = permissions.operator_required(async_ok_view)
    operator = await sync_to_async(make_user)("olga", OPERATORS)
    approver = await sync_to_async(make_user)("ada", APPROVERS)
    assert (await call(view, operator)).content == b"ok"
    with pytest.raises(PermissionDenied):
        await call(view, approver)
    assert (await call(view, AnonymousUser())).status_code == 302
    await sync_to_async(connections.close_all)()  # the worker thread's connection would block dropping the test db


# --- sign in and out ---------------------------------------------------------------------------------


def test_sign_in_page_is_ours_not_the_admin_sites(client):
    page = client.get("/accounts/login/").content.decode()
    assert "Sign in to task" in page
    assert 'autocomplete="current-password"' in page
    assert "Django administration" not in page


def test_signing_in_lands_on_next_or_home(client):
    make_user("olga", OPERATORS, password=TEST_PASSWORD)
    response = client.post("/accounts/login/", {"username": "olga", "password": TEST_PASSWORD})
    assert response.status_code == 302
    assert response["Location"] == "/"
    client.logout()
    response = client.post("/accounts/login/", {"username": "olga", "password": TEST_PASSWORD, "next": "/healthz"})
    assert response["Location"] == "/healthz"


def test_signing_in_refuses_a_foreign_next(client):
    make_user("olga", OPERATORS, password=TEST_PASSWORD)
    response = client.post(
        "/accounts/login/", {"username": "olga", "password": TEST_PASSWORD, "next": "https://evil.example/"}
    )
    assert response["Location"] == "/"


def test_a_wrong_password_says_so_clearly(client):
    make_user("olga", OPERATORS, password=TEST_PASSWORD)
    response = client.post("/accounts/login/", {"username": "olga", "password": "wrong"})
    assert response.status_code == 200
    page = response.content.decode()
    assert "That username and password do not match an account" in page
    assert 'role="alert"' in page
    assert "_auth_user_id" not in client.session


def test_signing_out_needs_post_and_says_so(client):
    client.force_login(make_user("olga", OPERATORS))
    assert client.get("/accounts/logout/").status_code == 405
    response = client.post("/accounts/logout/", follow=True)
    assert response.redirect_chain[-1][0] == "/accounts/login/"
    assert "You are signed out." in response.content.decode()
    assert "_auth_user_id" not in client.session


@pytest.mark.parametrize(
    ("person", "visible"),
    [
        ("anonymous", set()),
        ("approver", {"Tasks", "Inbox", "API", "Notifications"}),
        ("operator", {"Tasks", "Launch", "API", "Notifications"}),
        ("admin", {"Tasks", "Launch", "Servers", "Approvals", "Audit", "People", "API", "Notifications"}),
        ("nobody", {"Tasks", "API", "Notifications"}),
        ("agent", {"API", "Notifications"}),  # an agent's account: its tokens; its tasks are followed through them
    ],
)
def test_the_nav_shows_what_the_role_may_use(client, people, person, visible):
    if person != "anonymous":
        client.force_login(people[person])
    page = client.get("/").content.decode()
    nav = page[page.index('<nav class="mainnav"') : page.index("</nav>")]
    # A hidden item is there for the live nav (an approver role granted while the page is open), not shown.
    shown = set(re.findall(r'<li(?![^>]*\bhidden\b)[^>]*>\s*<a class="navlink[^"]*"[^>]*>\s*(\w+)', nav))
    assert shown == visible
    assert ("Sign in" in page) is (person == "anonymous")


def test_a_refusal_page_says_who_may_and_who_you_are(client, people, settings):
    settings.ROOT_URLCONF = __name__
    client.force_login(people["approver"])
    response = client.get("/only-admins")
    assert response.status_code == 403
    page = response.content.decode()
    assert "This page is for admins." in page
    assert "signed in as <strong>fiona</strong>" in page


urlpatterns = [*project_urls.urlpatterns, path("only-admins", permissions.admin_required(ok_view))]


@pytest.mark.django_db(transaction=True)
def test_the_role_groups_come_back_after_a_flush():
    from django.core.management import call_command

    call_command("flush", interactive=False, verbosity=0)
    assert set(Group.objects.values_list("name", flat=True)) >= {APPROVERS, OPERATORS, ADMINS}
