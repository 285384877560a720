"""The approver inbox and answering (taskhub/tasks/views/inbox.py): who sees what, field types, refusals, live cards."""

import re
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone, translation
from django.utils.html import escape

from taskhub.accounts.groups import APPROVERS, OPERATORS
from taskhub.approvals.models import ApprovalPolicy
from taskhub.audit.models import AuditEvent
from taskhub.audit.services import record_event
from taskhub.mcp.schema_fields import ELICITATION
from taskhub.tasks import services
from taskhub.tasks.card_context import BEFORE_SHOWN, SETTLED_AFTER, with_context
from taskhub.tasks.input_cards import card_for
from taskhub.tasks.live_inbox import inbox_fragment
from taskhub.tasks.models import InputRequest, InputRequestState, Task
from taskhub.tasks.url_targets import url_target
from tests.account_fixtures import make_user
from tests.helpers import snapshot
from tests.inbox_fixtures import client_for, remote_id, request_of, task_asking

pytestmark = pytest.mark.django_db

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "title": "Name", "minLength": 2, "maxLength": 10},
        "email": {"type": "string", "format": "email"},
        "homepage": {"type": "string", "format": "uri"},
        "birthday": {"type": "string", "format": "date"},
        "meeting": {"type": "string", "format": "date-time"},
        "count": {"type": "integer", "minimum": 1, "maximum": 5, "default": 2},
        "ratio": {"type": "number", "minimum": 0, "maximum": 1},
        "agree": {"type": "boolean", "default": True},
        "size": {"type": "string", "enum": ["S", "M", "L"], "enumNames": ["Small", "Medium", "Large"]},
        "colour": {"type": "string", "oneOf": [{"const": "red", "title": "Red"}, {"const": "blue", "title": "Blue"}]},
        "toppings": {
            "type": "array",
            "items": {"type": "string", "anyOf": [{"const": "cheese", "title": "Cheese"}, {"const": "ham"}]},
            "minItems": 1,
            "maxItems": 2,
        },
    },
    "required": ["name", "count"],
}
FORM = {"method": "elicitation/create", "params": {"message": "Fill in <b>this</b>", "requestedSchema": SCHEMA}}
URL = {
    "method": "elicitation/create",
    "params": {"mode": "url", "message": "Sign in", "url": "https://auth.example/x?y=1"},
}
XSS = '<img src=x onerror="alert(1)">'
SIGNAL = '<template id="inbox-live-signal" hx-swap-oob="none:body" data-live-replace'


@pytest.fixture
def dana(servers):
    return make_user("dana", APPROVERS, "team-alpha")


@pytest.fixture
def bob(servers):
    return make_user("bob", APPROVERS, "team-beta")


@pytest.fixture
def form_request(servers):
    return request_of(task_asking(servers[0], {"form": FORM}), "form")


def accept(client, input_request, htmx=False, **fields):
    data = {"action": "accept"}
    for name, value in fields.items():
        data[ELICITATION.html_prefix + name] = value
    headers = {"HX-Request": "true"} if htmx else {}
    return client.post(reverse("tasks:answer", args=[input_request.pk]), data, headers=headers)


# --- who sees what ---------------------------------------------------------------------------------------------


def test_anonymous_users_are_sent_to_sign_in(form_request):
    for response in (
        Client().get(reverse("tasks:inbox")),
        Client().post(reverse("tasks:answer", args=[form_request.pk]), {"action": "decline"}),
    ):
        assert response.status_code == 302 and response.url.startswith(reverse("accounts:login"))
    form_request.refresh_from_db()
    assert form_request.state == InputRequestState.OPEN


def test_an_operator_who_is_no_approver_gets_403(form_request):
    client = client_for(make_user("olga", OPERATORS))
    assert client.get(reverse("tasks:inbox")).status_code == 403
    assert client.post(reverse("tasks:answer", args=[form_request.pk]), {"action": "decline"}).status_code == 403
    form_request.refresh_from_db()
    assert form_request.state == InputRequestState.OPEN


def test_the_inbox_lists_open_requests_of_the_users_servers_oldest_first(servers, ada, bob):
    alpha, beta = servers
    first = task_asking(alpha, {"first": FORM}, tool="first_tool")
    task_asking(beta, {"beta-only": FORM}, tool="beta_tool")
    second = task_asking(alpha, {"second": URL}, tool="second_tool")
    answered = task_asking(alpha, {"done": FORM}, tool="answered_tool")
    services.answer_input(input_request=request_of(answered, "done"), response={"action": "decline"}, user=ada)

    page = client_for(ada).get(reverse("tasks:inbox")).content.decode()
    ids = re.findall(r'<article class="ir-card[^"]*" id="ir-(\d+)"', page)
    assert ids == [str(request_of(first, "first").pk), str(request_of(second, "second").pk)]
    assert "beta_tool" not in page and "answered_tool" not in page
    assert "first_tool" in page and reverse("tasks:detail", args=[first.id]) in page
    assert "server says:" in page and "Fill in &lt;b&gt;this&lt;/b&gt;" in page

    # the nav badge counts the same requests: the open ones of the user's servers
    assert 'aria-label="open requests" data-approver="yes">2</span>' in page

    bobs = client_for(bob).get(reverse("tasks:inbox")).content.decode()
    assert "beta_tool" in bobs and "first_tool" not in bobs
    assert 'aria-label="open requests" data-approver="yes">1</span>' in bobs


def test_an_input_request_carries_its_tasks_server(servers):
    # the inbox and the nav badge filter open requests by this copy of the task's server
    beta = servers[1]
    asked = request_of(task_asking(beta, {"form": FORM}), "form")
    assert asked.server_id == beta.pk == asked.task.server_id
    made_directly = InputRequest.objects.create(task=asked.task, key="other", method="elicitation/create")
    assert made_directly.server_id == beta.pk


def test_an_approver_of_another_server_cannot_answer_by_a_forged_post(form_request, bob):
    response = accept(client_for(bob), form_request, name="Bob", count="2")
    # 404 as in the API, and the server is not named: to bob the request does not exist.
    assert response.status_code == 404
    assert form_request.task.server.name not in response.content.decode()
    form_request.refresh_from_db()
    assert form_request.state == InputRequestState.OPEN
    assert not AuditEvent.objects.filter(action="input.answered").exists()


def test_an_empty_inbox_is_friendly(ada):
    page = client_for(ada).get(reverse("tasks:inbox")).content.decode()
    assert "Nothing waiting for you" in page


def test_the_form_shows_every_field_type_with_defaults_and_required(form_request, ada):
    page = client_for(ada).get(reverse("tasks:inbox")).content.decode()
    pk = form_request.pk
    for snippet in (
        f'type="text" id="ir{pk}-f0" name="f:name" value="" required minlength="2" maxlength="10"',
        'type="email"',
        'type="url"',
        'type="date"',
        'type="datetime-local"',
        f'type="number" id="ir{pk}-f1" name="f:count" value="2" required step="1" min="1" max="5"',
        'step="any" min="0" max="1"',
        'name="f:agree" value="true" checked',
        '<option value="S">Small</option>',
        '<option value="red">Red</option>',
        'name="f:toppings" value="cheese"> <span>Cheese</span>',
        "Pick at least 1. Pick at most 2.",
        'value="accept" data-accept',
        'value="decline" formnovalidate',
        'value="cancel" formnovalidate',
    ):
        assert snippet in page, snippet


def test_schema_text_from_the_server_is_escaped(servers, ada):
    schema = {"type": "object", "properties": {"x": {"type": "string", "title": XSS, "description": XSS}}}
    task_asking(
        servers[0], {"k": {"method": "elicitation/create", "params": {"message": XSS, "requestedSchema": schema}}}
    )
    page = client_for(ada).get(reverse("tasks:inbox")).content.decode()
    assert XSS not in page
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page


# --- answering --------------------------------------------------------------------------------------------------


def test_a_full_accept_is_recorded_with_typed_content_and_redirects(form_request, ada):
    client = client_for(ada)
    response = accept(
        client,
        form_request,
        name="Luca",
        email="luca@example.com",
        homepage="https://luca.example/",
        birthday="1990-02-03",
        meeting="2026-07-28T14:30",
        count="3",
        ratio="0.5",
        agree="true",
        size="M",
        colour="blue",
        toppings=["cheese", "ham"],
    )
    assert response.status_code == 302 and response.url == reverse("tasks:inbox")
    form_request.refresh_from_db()
    assert form_request.state == InputRequestState.ANSWERED and form_request.answered_by == ada
    assert form_request.answer == {
        "action": "accept",
        "content": {
            "name": "Luca",
            "email": "luca@example.com",
            "homepage": "https://luca.example/",
            "birthday": "1990-02-03",
            "meeting": "2026-07-28T14:30:00Z",
            "count": 3,
            "ratio": 0.5,
            "agree": True,
            "size": "M",
            "colour": "blue",
            "toppings": ["cheese", "ham"],
        },
    }
    page = client.get(response.url).content.decode()
    assert "Accepted: the answer to alpha is recorded" in page
    assert "Nothing waiting for you" in page


def test_an_unchecked_box_is_false_and_empty_optional_fields_are_left_out(form_request, ada):
    accept(client_for(ada), form_request, name="Luca", count="1", email="", ratio="")
    form_request.refresh_from_db()
    assert form_request.answer["content"] == {"name": "Luca", "count": 1, "agree": False}


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"count": "2"}, "name", "this field is required"),
        ({"name": "L", "count": "2"}, "name", "at least 2 characters"),
        ({"name": "Lucaaaaaaaaaaa", "count": "2"}, "name", "at most 10 characters"),
        ({"name": "Luca", "count": "2", "email": "nope"}, "email", "email address"),
        ({"name": "Luca", "count": "2", "homepage": "luca.example"}, "homepage", "absolute URI"),
        ({"name": "Luca", "count": "2", "birthday": "03/02/1990"}, "birthday", "a date like"),
        ({"name": "Luca", "count": "2", "meeting": "tomorrow"}, "meeting", "date and time"),
        ({"name": "Luca", "count": "two"}, "count", "whole number"),
        ({"name": "Luca", "count": "2.5"}, "count", "whole number"),
        ({"name": "Luca", "count": "9"}, "count", "at most 5"),
        ({"name": "Luca", "count": "0"}, "count", "at least 1"),
        ({"name": "Luca", "count": "2", "ratio": "lots"}, "ratio", "must be a number"),
        ({"name": "Luca", "count": "2", "ratio": "1.5"}, "ratio", "at most 1"),
        ({"name": "Luca", "count": "2", "size": "XL"}, "size", "one of S, M, L"),
        ({"name": "Luca", "count": "2", "colour": "green"}, "colour", "one of red, blue"),
        ({"name": "Luca", "count": "2", "toppings": ["pineapple"]}, "toppings", "not among the choices"),
    ],
)
def test_each_field_problem_is_shown_inline_with_the_input_kept_and_nothing_recorded(
    form_request, ada, fields, field, message
):
    for htmx in (False, True):
        response = accept(client_for(ada), form_request, htmx=htmx, **fields)
        assert response.status_code == (200 if htmx else 400)
        page = response.content.decode()
        assert re.search(rf'<p class="field-error" id="ir{form_request.pk}-f\d+-error">[^<]*{re.escape(message)}', page)
        assert page.count("please correct the fields marked below") == 1  # in the card, not again atop the page
        if not htmx:
            assert f'Your answer was not recorded: <a href="#ir-{form_request.pk}">' in page
        for name, value in fields.items():
            if name not in ("size", "colour", "toppings"):  # a choice not offered cannot be shown selected
                assert f'value="{value}"' in page
        if htmx:
            assert page.lstrip().startswith("<article")  # the card alone, swapped in place
    form_request.refresh_from_db()
    assert form_request.state == InputRequestState.OPEN
    assert not AuditEvent.objects.filter(action="input.answered").exists()


@pytest.mark.parametrize("action", ["decline", "cancel"])
def test_decline_and_cancel_send_no_content_and_skip_validation(form_request, ada, action):
    response = client_for(ada).post(
        reverse("tasks:answer", args=[form_request.pk]), {"action": action, "f:count": "not a number"}
    )
    assert response.status_code == 302
    form_request.refresh_from_db()
    assert form_request.answer == {"action": action}


def test_an_unknown_action_is_refused(form_request, ada):
    response = client_for(ada).post(reverse("tasks:answer", args=[form_request.pk]), {"action": "maybe"})
    assert response.status_code == 400
    assert "Choose Accept, Decline or Cancel." in response.content.decode()
    form_request.refresh_from_db()
    assert form_request.state == InputRequestState.OPEN


def test_htmx_answer_returns_the_card_answered_by_you(form_request, ada):
    response = accept(client_for(ada), form_request, htmx=True, name="Luca", count="2")
    page = response.content.decode()
    assert response.status_code == 200
    assert 'data-state="answered"' in page and "answered by you" in page and "delivering…" in page
    services.mark_delivered(input_request=form_request)
    form_request.refresh_from_db()
    fragment = inbox_fragment(form_request.task, ada)
    assert "delivered ✓" in fragment and SIGNAL in fragment


def test_the_answered_card_is_shown_without_reading_anything_again(form_request, ada):
    # The answer view holds daphne's one sync thread, which also renders every live change: after the commit it
    # shows the card from the rows it locked instead of reading the request, its answerer, task and server again.
    client = client_for(ada)
    with CaptureQueriesContext(connection) as queries:
        response = accept(client, form_request, htmx=True, name="Luca", count="2")
    assert response.status_code == 200 and "answered by you" in response.content.decode()
    statements = [query["sql"] for query in queries.captured_queries]
    [deferred] = [i for i, sql in enumerate(statements) if "procrastinate_defer_jobs" in sql]
    # The view's transaction ends (a savepoint, inside the test's transaction).
    assert [sql.split()[0] for sql in statements[deferred + 1 :]] == ["RELEASE"]


def test_an_answer_reads_the_policy_once_for_who_and_once_for_its_terms(form_request, ada):
    # The view asks whether the policy names the approver before it parses the answer, and the answer service asks
    # again under the task's lock: the second question is answered from the first (one query, not four), and the
    # terms (answerers, N of M) are read once for the form and the service.
    with CaptureQueriesContext(connection) as queries:
        response = accept(client_for(ada), form_request, htmx=True, name="Luca", count="2")
    assert response.status_code == 200 and "answered by you" in response.content.decode()
    policy_reads = [query["sql"] for query in queries.captured_queries if "approvals_approvalpolicy" in query["sql"]]
    who = [sql for sql in policy_reads if "EXISTS" in sql]
    assert len(who) == 1 and len(policy_reads) <= 4, policy_reads


def test_an_htmx_answer_costs_nine_statements_and_reads_the_request_once(form_request, ada):
    # The answer view runs on the approver's click (bench/approval.py: submit -> answer stored, goal 15 ms). Its
    # statements: the session; the user with the names of their role groups (accounts.backends); the request with
    # its task and server, locked once for the view's checks and the answer (services.locked_for_answer); the policy
    # (whether it names ada, and its terms, at once); the answer, its audit row and its delivery job; the two ends
    # of the view's transaction, which the service's is (here a savepoint, in the test's). The card sent back is
    # the one built for the form, showing the answer: no read after.
    client = client_for(ada)
    with CaptureQueriesContext(connection) as queries:
        response = accept(client, form_request, htmx=True, name="Luca", count="2")
    page = response.content.decode()
    assert response.status_code == 200 and 'data-state="answered"' in page and "answered by you" in page
    assert "Name" in page  # the card still says what was asked
    statements = [query["sql"] for query in queries.captured_queries]
    assert len(statements) == 9, "\n".join(" ".join(sql.split())[:100] for sql in statements)
    [user] = [sql for sql in statements if 'FROM "auth_user"' in sql and '"approvals_approvalpolicy"' not in sql]
    assert '"auth_group"' in user  # the roles come with the user
    request_reads = [sql for sql in statements if 'FROM "tasks_inputrequest"' in sql]
    assert len(request_reads) == 1 and "FOR NO KEY UPDATE OF" in request_reads[0], request_reads
    stored = next(i for i, sql in enumerate(statements) if sql.startswith('UPDATE "tasks_inputrequest"'))
    assert statements.index(request_reads[0]) < stored


def test_an_htmx_acceptance_short_of_n_of_m_shows_the_card_still_open_with_it(form_request, ada, dana):
    ApprovalPolicy.objects.filter(server=form_request.server).update(required_accepts=2)
    response = accept(client_for(ada), form_request, htmx=True, name="Luca", count="2")
    page = response.content.decode()
    assert response.status_code == 200 and 'data-state="open"' in page
    assert "1 of 2 accepted</strong>: ada · you accepted" in page
    response = accept(client_for(dana), form_request, htmx=True, name="Luca", count="2")
    page = response.content.decode()
    assert 'data-state="answered"' in page and "Accepted by ada, dana (2 of 2)." in page


def test_two_approvers_one_wins_the_other_is_told_who(form_request, ada, dana):
    assert accept(client_for(dana), form_request, name="Dana", count="2").status_code == 302
    for htmx in (False, True):
        response = accept(client_for(ada), form_request, htmx=htmx, name="Ada", count="3")
        page = response.content.decode()
        assert response.status_code == (200 if htmx else 409)
        assert "dana answered this first; your answer was not recorded." in page
        assert "answered by dana" in page and "just now" in page
    form_request.refresh_from_db()
    assert (form_request.answered_by, form_request.answer["content"]["name"]) == (dana, "Dana")


def test_a_withdrawn_request_says_so(form_request, ada):
    task = form_request.task
    services.apply_snapshot(
        task=task, snapshot=snapshot("input_required", task_id=remote_id(task), inputRequests={"other": URL})
    )
    response = client_for(ada).post(reverse("tasks:answer", args=[form_request.pk]), {"action": "decline"})
    assert response.status_code == 409
    page = response.content.decode()
    assert "The server no longer asks &#x27;form&#x27;" in page and "withdrawn" in page


def test_a_request_of_an_ended_task_says_so(form_request, ada):
    task = form_request.task
    services.apply_snapshot(task=task, snapshot=snapshot("completed", task_id=remote_id(task)))
    response = client_for(ada).post(reverse("tasks:answer", args=[form_request.pk]), {"action": "decline"})
    assert response.status_code == 409
    assert "The task ended (completed) before this was answered" in response.content.decode()


def test_next_brings_a_plain_post_back_only_to_this_site(form_request, ada):
    url = reverse("tasks:detail", args=[form_request.task_id])
    response = client_for(ada).post(reverse("tasks:answer", args=[form_request.pk]), {"action": "decline", "next": url})
    assert response.url == url
    other = task_asking(form_request.task.server, {"k": FORM})
    response = client_for(ada).post(
        reverse("tasks:answer", args=[request_of(other, "k").pk]),
        {"action": "decline", "next": "https://evil.example/"},
    )
    assert response.url == reverse("tasks:inbox")


# --- URL mode and other methods ---------------------------------------------------------------------------------


def test_a_url_request_shows_host_and_link_without_loading_anything(servers, ada):
    task_asking(servers[0], {"u": URL})
    page = client_for(ada).get(reverse("tasks:inbox")).content.decode()
    assert '<strong class="ir-host">auth.example</strong>' in page
    assert "https://auth.example/x?y=1" in page
    assert 'href="https://auth.example/x?y=1" target="_blank" rel="noopener noreferrer"' in page
    card = page[page.index('class="ir-card') : page.index("</article>")]
    assert "<img" not in card and "<iframe" not in card and "prefetch" not in card and "preload" not in card
    assert card.count("auth.example/x") == 2  # the text and the link, nothing that loads it


def test_accepting_a_url_request_is_consent_without_content(servers, ada):
    request = request_of(task_asking(servers[0], {"u": URL}), "u")
    response = client_for(ada).post(reverse("tasks:answer", args=[request.pk]), {"action": "accept", "f:x": "1"})
    assert response.status_code == 302
    request.refresh_from_db()
    assert request.answer == {"action": "accept"}


@pytest.mark.parametrize(
    "url", ["http://auth.example/x", "javascript:alert(1)", "data:text/html,hi", "ftp://auth.example/", ""]
)
def test_a_non_https_url_is_text_with_a_warning_and_cannot_be_accepted(servers, ada, url):
    bad = {"method": "elicitation/create", "params": {"mode": "url", "message": "Go", "url": url}}
    request = request_of(task_asking(servers[0], {"u": bad}), "u")
    client = client_for(ada)
    page = client.get(reverse("tasks:inbox")).content.decode()
    assert "ir-url-open" not in page and 'value="accept"' not in page and "⚠" in page
    if url:
        assert 'href="' + url not in page
    response = client.post(reverse("tasks:answer", args=[request.pk]), {"action": "accept"})
    assert response.status_code == 400
    request.refresh_from_db()
    assert request.state == InputRequestState.OPEN
    client.post(reverse("tasks:answer", args=[request.pk]), {"action": "decline"})
    request.refresh_from_db()
    assert request.answer == {"action": "decline"}


def test_http_on_loopback_is_allowed_for_development(servers, ada):
    local = {"method": "elicitation/create", "params": {"mode": "url", "message": "Go", "url": "http://127.0.0.1:9/cb"}}
    task_asking(servers[0], {"u": local})
    page = client_for(ada).get(reverse("tasks:inbox")).content.decode()
    assert 'href="http://127.0.0.1:9/cb" target="_blank" rel="noopener noreferrer"' in page


OPENABLE_URLS = [
    "https://auth.example/x?y=1",
    "HTTPS://Auth.Example:8443/x",
    "http://127.0.0.1:9/cb",
    "http://127.8.9.10/cb",
    "http://[::1]:8080/cb",
    "http://localhost/cb",
    "http://LOCALHOST:3000/cb",
]
REFUSED_URLS = [
    "javascript:alert(1)",
    "JavaScript:alert(document.cookie)",
    " javascript:alert(1)",
    "java\tscript:alert(1)",
    "data:text/html,<script>alert(1)</script>",
    "vbscript:msgbox(1)",
    "file:///etc/passwd",
    "http://example.com/cb",
    "http://localhost.evil.example/cb",
    "http://127.0.0.1.evil.example/cb",
    "http://localhost@evil.example/cb",
    "http://[::ffff:8.8.8.8]/cb",
    "https://",
    "//evil.example/cb",
    "https://auth.example/\nx",
]


def url_request(server, url):
    body = {"method": "elicitation/create", "params": {"mode": "url", "message": "Go", "url": url}}
    return request_of(task_asking(server, {"u": body}), "u")


@pytest.mark.parametrize("url", OPENABLE_URLS)
def test_https_anywhere_and_http_on_loopback_can_be_opened_and_accepted(servers, ada, url):
    request = url_request(servers[0], url)
    client = client_for(ada)
    page = client.get(reverse("tasks:inbox")).content.decode()
    assert f'href="{escape(url)}" target="_blank" rel="noopener noreferrer"' in page
    assert client.post(reverse("tasks:answer", args=[request.pk]), {"action": "accept"}).status_code == 302
    request.refresh_from_db()
    assert request.answer == {"action": "accept"}


@pytest.mark.parametrize("url", REFUSED_URLS)
def test_any_other_url_is_shown_as_text_and_cannot_be_accepted(servers, ada, url):
    request = url_request(servers[0], url)
    client = client_for(ada)
    page = client.get(reverse("tasks:inbox")).content.decode()
    card = page[page.index('class="ir-card') : page.index("</article>")]
    assert "ir-url-open" not in card and 'value="accept"' not in card and "⚠" in card
    assert f'href="{escape(url)}' not in card and f'href="{escape(url.strip())}' not in card
    assert "<script>" not in card
    assert client.post(reverse("tasks:answer", args=[request.pk]), {"action": "accept"}).status_code == 400
    request.refresh_from_db()
    assert request.state == InputRequestState.OPEN and request.answer is None


def test_the_whole_url_is_shown_escaped_however_long_or_odd(servers, ada):
    url = 'https://auth.example/cb?next="><script>alert(1)</script>&state=' + "s" * 1500 + "#end"
    url_request(servers[0], url)
    page = client_for(ada).get(reverse("tasks:inbox")).content.decode()
    card = page[page.index('class="ir-card') : page.index("</article>")]
    assert f'<code class="ir-url-text">{escape(url)}</code>' in card  # the full address, as text
    assert f'href="{escape(url)}"' in card  # and the link is that very address
    assert "<script>alert(1)" not in card


@pytest.mark.parametrize(
    "request_body",
    [{"method": "roots/list", "params": {}}, {"method": "something/new", "params": {"x": 1}}],
)
def test_other_methods_are_shown_as_text_with_no_buttons_and_cannot_be_answered(servers, ada, request_body):
    request = request_of(task_asking(servers[0], {"o": request_body}), "o")
    client = client_for(ada)
    page = client.get(reverse("tasks:inbox")).content.decode()
    assert "taskhub cannot answer this kind of request here" in page
    assert 'name="action"' not in page and XSS not in page
    response = client.post(reverse("tasks:answer", args=[request.pk]), {"action": "decline"})
    assert response.status_code == 400
    request.refresh_from_db()
    assert request.state == InputRequestState.OPEN


def test_a_tasks_sampling_request_is_shown_escaped_and_answered_with_a_written_reply_only(servers, ada):
    asking = {
        "method": "sampling/createMessage",
        "params": {
            "messages": [{"role": "user", "content": {"type": "text", "text": XSS}}],
            "systemPrompt": XSS,
            "maxTokens": 9,
        },
    }
    request = request_of(task_asking(servers[0], {"o": asking}), "o")
    client = client_for(ada)
    page = client.get(reverse("tasks:inbox")).content.decode()
    assert "asks for a language model's message" in page and "Send reply" in page
    assert XSS not in page and escape(XSS) in page
    assert 'value="decline"' not in page  # a task's own sampling request has no way to say no
    assert client.post(reverse("tasks:answer", args=[request.pk]), {"action": "decline"}).status_code == 400
    assert client.post(reverse("tasks:answer", args=[request.pk]), {"action": "accept", "reply": ""}).status_code == 400
    request.refresh_from_db()
    assert request.state == InputRequestState.OPEN
    answered = client.post(reverse("tasks:answer", args=[request.pk]), {"action": "accept", "reply": "four"})
    assert answered.status_code == 302
    request.refresh_from_db()
    assert request.answer["content"] == {"type": "text", "text": "four"} and request.answer["role"] == "assistant"


def test_a_form_taskhub_cannot_render_offers_only_decline_and_cancel(servers, ada):
    odd = {"method": "elicitation/create", "params": {"message": "?", "requestedSchema": {"properties": ["x"]}}}
    request = request_of(task_asking(servers[0], {"o": odd}), "o")
    client = client_for(ada)
    page = client.get(reverse("tasks:inbox")).content.decode()
    assert "taskhub cannot render this request; decline or cancel it." in page
    assert 'value="accept"' not in page and 'value="decline"' in page
    assert client.post(reverse("tasks:answer", args=[request.pk]), {"action": "accept"}).status_code == 400
    assert client.post(reverse("tasks:answer", args=[request.pk]), {"action": "cancel"}).status_code == 302
    request.refresh_from_db()
    assert request.answer == {"action": "cancel"}


# --- the list re-fetch and the live fragment ---------------------------------------------------------------------


def test_the_card_list_fragment_adds_cards_asked_for_by_id(servers, ada, dana, bob):
    alpha, beta = servers
    answered = request_of(task_asking(alpha, {"a": FORM}), "a")
    services.answer_input(input_request=answered, response={"action": "decline"}, user=dana)
    foreign = request_of(task_asking(beta, {"b": FORM}), "b")
    fresh = request_of(task_asking(alpha, {"c": URL}), "c")
    response = client_for(ada).get(
        reverse("tasks:inbox"), {"fragment": "cards", "include": f"{answered.pk},{foreign.pk},x"}
    )
    page = response.content.decode()
    assert page.lstrip().startswith('<div id="inbox-groups"') and 'id="inbox-cards"' in page and "<html" not in page
    assert re.findall(r'id="ir-(\d+)"', page) == [str(answered.pk), str(fresh.pk)]
    assert "answered by dana" in page


def test_the_live_fragment_replaces_changed_cards_and_asks_for_new_ones(servers, ada, dana):
    task = task_asking(servers[0], {"first": FORM})
    first = request_of(task, "first")
    fragment = inbox_fragment(task, ada)
    assert 'id="ir-' not in fragment  # an open card is never pushed: someone may be typing in it
    # One signal, whose target every page has (body): an open inbox re-fetches its list.
    assert fragment == f"{SIGNAL} data-open-requests></template>"

    services.answer_input(
        input_request=first, response={"action": "accept", "content": {"name": "Dana", "count": 2}}, user=dana
    )
    fragment = inbox_fragment(task, ada)
    assert fragment.startswith(f"{SIGNAL}>") and fragment.endswith("</template>")  # nothing open: nothing to fetch
    assert f'id="ir-{first.pk}" data-state="answered"' in fragment and "hx-swap-oob" not in fragment.split(">", 1)[1]
    assert "answered by dana" in fragment and "(accepted)" in fragment
    assert "answered by you" in inbox_fragment(task, dana)

    services.apply_snapshot(
        task=task, snapshot=snapshot("input_required", task_id=remote_id(task), inputRequests={"second": FORM})
    )
    fragment = inbox_fragment(task, ada)
    assert fragment.startswith(f"{SIGNAL} data-open-requests>") and f'id="ir-{first.pk}"' in fragment
    services.apply_snapshot(task=task, snapshot=snapshot("cancelled", task_id=remote_id(task)))
    second = request_of(task, "second")
    fragment = inbox_fragment(Task.objects.select_related("server").get(pk=task.pk), ada)
    assert f'id="ir-{second.pk}" data-state="ended"' in fragment and "The task ended (cancelled)" in fragment


def test_the_inbox_renderer_is_registered_for_the_live_socket():
    from taskhub.live.fragments import FragmentKind, Sharing, registered_task_fragments

    # Per user, not per audience: a card says "answered by you".
    assert inbox_fragment in registered_task_fragments(FragmentKind.INBOX, Sharing.USER)


def test_the_inbox_shows_the_oldest_cards_and_says_how_many_more_wait(servers, ada, monkeypatch):
    from taskhub.tasks.views import inbox as inbox_views

    monkeypatch.setattr(inbox_views, "CARDS_SHOWN", 2)
    tasks = [task_asking(servers[0], {f"q{n}": FORM}) for n in range(3)]
    html = client_for(ada).get("/inbox/").content.decode()
    assert html.count('class="ir-card') == 2
    assert f'id="ir-{request_of(tasks[0], "q0").pk}"' in html  # the oldest first
    assert f'id="ir-{request_of(tasks[2], "q2").pk}"' not in html
    assert "1 more waiting after these" in html


def test_a_page_of_cards_of_every_kind_reads_as_many_statements_as_a_page_of_one(servers, ada, dana, monkeypatch):
    """The inbox reads of its cards' tasks and servers only what the cards read (input_cards.CARD_TASK_READS): a card
    that came to read another column would load it with one statement per card, which this counts."""
    from taskhub.approvals.services import create_policy
    from taskhub.tasks.models import GATE_METHOD
    from taskhub.web.templatetags import taskhub_rows
    from tests.catalogue_fixtures import with_tools

    alpha = servers[0]
    task_asking(alpha, {"form": FORM})
    client = client_for(ada)

    def statements(**params) -> tuple[int, str]:
        monkeypatch.setattr(taskhub_rows, "_kept", {})  # every card rendered afresh: a kept one reads nothing
        with CaptureQueriesContext(connection) as queries:
            response = client.get(reverse("tasks:inbox"), params)
        assert response.status_code == 200
        sql = [query["sql"] for query in queries.captured_queries]
        # Nor a server's catalogue or credentials, for a card or a choice of the filter (servers.forms.CHOICE_SHOWS).
        assert not [each for each in sql if '"servers_server"."tools"' in each or '"servers_server"."env"' in each]
        if not params:  # the nav's badge is what the unfiltered listing counted, not counted again
            assert not [each for each in sql if "inputrequeststatedelta" in each]
        return len(sql), response.content.decode()

    one, _ = statements()
    sampling = {"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 9}}
    other = {"method": "something/new", "params": {"x": 1}}
    task_asking(alpha, {"url": URL, "sampling": sampling, "other": other}, tool="many")
    services.apply_snapshot(  # a status message beside its question
        task=(said := task_asking(alpha, {"said": FORM}, tool="said")),
        snapshot=snapshot(
            "input_required", task_id=remote_id(said), statusMessage="halfway", inputRequests={"said": FORM}
        ),
    )
    create_policy(server=alpha, tool="deploy", gate_before_call=True, user=None)  # ada launched it: barred
    services.launch(server=with_tools(alpha, "deploy"), tool="deploy", arguments={"target": "prod"}, user=ada)
    create_policy(server=alpha, tool="twice", required_accepts=2, answer_within=timedelta(hours=1), user=None)
    twice = request_of(task_asking(alpha, {"twice": FORM}, tool="twice"), "twice")
    accepted = {"action": "accept", "content": {"name": "Luca", "count": 2}}
    services.answer_input(input_request=twice, response=accepted, user=dana)
    assert InputRequest.objects.filter(method=GATE_METHOD, state="open").count() == 1

    many, page = statements()
    assert many == one
    assert "halfway" in page and "&quot;target&quot;: &quot;prod&quot;" in page and "1 of 2 accepted" in page

    # The live re-fetch, with cards asked for by id that are no longer open (read by another query).
    done = [request_of(task_asking(alpha, {f"done{n}": URL}, tool=f"done{n}"), f"done{n}") for n in range(2)]
    services.answer_input(input_request=done[0], response={"action": "decline"}, user=dana)
    alone, page = statements(fragment="cards", include=str(done[0].pk))
    assert "answered by dana" in page
    services.answer_input(input_request=done[1], response={"action": "accept"}, user=dana)
    both, page = statements(fragment="cards", include=f"{done[0].pk},{done[1].pk}")
    assert both == alone and page.count("answered by dana") == 2


# --- URL-mode requests: which links may be opened ---------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "clickable", "host"),
    [
        ("https://example.com/authorize?x=1", True, "example.com"),
        ("HTTPS://Example.COM/", True, "example.com"),
        ("https://google.com@evil.example/", True, "evil.example"),
        ("http://127.0.0.1:8000/cb", True, "127.0.0.1"),
        ("http://localhost/cb", True, "localhost"),
        ("http://[::1]/cb", True, "::1"),
        ("http://example.com/", False, "example.com"),
        ("javascript:alert(1)", False, ""),
        ("data:text/html,<script>alert(1)</script>", False, ""),
        ("ftp://example.com/file", False, "example.com"),
        ("https:///nohost", False, ""),
        ("https://exa mple.com/", False, "exa mple.com"),
        ("https://example.com:notaport/", False, ""),
        ("", False, ""),
        (None, False, ""),
        (["https://example.com"], False, ""),
    ],
)
def test_only_https_or_loopback_http_urls_are_clickable(url, clickable, host):
    target = url_target(url)
    assert (target.clickable, target.host) == (clickable, host)
    if not clickable:
        assert target.problem


def test_a_cards_context_shows_the_latest_events_before_its_question_in_the_readers_words(servers, ada):
    alpha, _ = servers
    quiet = task_asking(alpha, {"go": FORM})
    busy = task_asking(alpha, {"go": FORM})
    with transaction.atomic():
        for _ in range(BEFORE_SHOWN + 3):
            record_event(action="task.protocol_error", actor_label="worker", task=busy, data={})
    asked = {task.pk: list(AuditEvent.objects.filter(task=task).order_by("time", "pk")) for task in (quiet, busy)}
    requests = [request_of(task, "go") for task in (quiet, busy)]
    with translation.override("zh-hans"):
        cards = with_context([card_for(request, ada, may_answer=True) for request in requests])
    for card, task in zip(cards, (quiet, busy), strict=True):
        before = [
            event for event in asked[task.pk] if event.time <= card.input_request.created_at + timedelta(seconds=2)
        ]
        with translation.override("zh-hans"):
            expected = [(event.time, event.shown_actor, event.shown_description) for event in before[-BEFORE_SHOWN:]]
        assert [(event.time, event.actor, event.words) for event in card.context.before] == expected
        assert card.context.earlier == (len(before) > BEFORE_SHOWN)  # the card says only that there are earlier ones
    assert cards[1].context.earlier and len(cards[1].context.before) == BEFORE_SHOWN
    assert "工作进程" in {event.actor for event in cards[1].context.before}  # "worker" in the reader's language


def test_what_happened_before_a_question_asked_a_minute_ago_is_read_once(
    servers, ada, django_assert_num_queries, monkeypatch
):
    """The events before a settled question (card_context.SETTLED_AFTER) are kept, per language: the inbox's re-fetch
    on each change reads them no more. A question just asked may still have its events being written: read each time."""
    card = card_for(request_of(task_asking(servers[0], {"go": FORM}), "go"), ada, may_answer=True)

    def shown(language="en"):
        with translation.override(language):
            return [(event.actor, event.words) for event in with_context([card])[0].context.before]

    first = shown()
    assert first, "the task's launch is before its question"
    with django_assert_num_queries(1):
        assert shown() == first
    later = timezone.now() + SETTLED_AFTER * 2
    monkeypatch.setattr(timezone, "now", lambda: later)
    shown()
    with django_assert_num_queries(0):
        assert shown() == first
    with django_assert_num_queries(1):
        assert shown("zh-hans") != first  # in the reader's words, read once for them
    with django_assert_num_queries(0):
        shown("zh-hans")
