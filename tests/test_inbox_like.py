"""Answering like requests with one form (taskhub/tasks/like_requests.py, the inbox's tasks:answer_like)."""

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse

from taskhub.accounts.groups import APPROVERS, OPERATORS
from taskhub.approvals.services import create_policy
from taskhub.audit.models import AuditEvent
from taskhub.mcp.schema_fields import ELICITATION
from taskhub.tasks import services
from taskhub.tasks.like_requests import answer_each, likeness
from taskhub.tasks.models import InputRequestState
from tests.account_fixtures import make_user
from tests.inbox_fixtures import client_for, request_of, task_asking

pytestmark = pytest.mark.django_db

SCHEMA = {
    "type": "object",
    "properties": {"reason": {"type": "string", "title": "Reason", "minLength": 3}},
    "required": ["reason"],
}
ASK = {"method": "elicitation/create", "params": {"message": "Deploy build 4127?", "requestedSchema": SCHEMA}}
OTHER = {"method": "elicitation/create", "params": {"message": "Deploy build 4128?", "requestedSchema": SCHEMA}}


def asking(server, n, request=ASK, tool="deploy"):
    return [request_of(task_asking(server, {"q": request}, tool=tool), "q") for _ in range(n)]


def answer_like(client, requests, action="accept", **fields):
    data = {"action": action, "request": [str(ir.pk) for ir in requests]}
    data.update({ELICITATION.html_prefix + name: value for name, value in fields.items()})
    return client.post(reverse("tasks:answer_like"), data, follow=True)


def answered_events():
    return AuditEvent.objects.filter(action="input.answered")


def test_like_requests_are_grouped_with_their_count_and_unlike_ones_are_not(servers, ada):
    alpha, _ = servers
    like = asking(alpha, 3)
    lone = asking(alpha, 1, OTHER)[0]
    other_tool = asking(alpha, 1, tool="release")[0]
    assert len({likeness(ir) for ir in like}) == 1
    assert likeness(lone) != likeness(like[0]) and likeness(other_tool) != likeness(like[0])

    page = client_for(ada).get(reverse("tasks:inbox")).content.decode()
    group = page.split(f'id="like-{likeness(like[0])}"', 1)[1].split("</section>", 1)[0]
    assert '<span class="like-count">3</span> requests ask the same' in group
    for ir in like:
        assert f'name="request" value="{ir.pk}" checked' in group
    assert f'value="{lone.pk}"' not in group and f'value="{other_tool.pk}"' not in group
    assert page.count('class="like-group"') == 1
    assert page.count('class="ir-card') == 5  # each request keeps its own card too


def test_one_submit_answers_each_request_through_the_service_with_its_own_audit_row(servers, ada):
    like = asking(servers[0], 4)
    response = answer_like(client_for(ada), like, reason="release train")
    assert response.status_code == 200
    assert "Accepted 4 requests from alpha" in response.content.decode()
    for ir in like:
        ir.refresh_from_db()
        assert ir.state == InputRequestState.ANSWERED and ir.answered_by == ada
        assert ir.answer == {"action": "accept", "content": {"reason": "release train"}}
    events = answered_events()
    assert events.count() == 4
    assert {event.task_id for event in events} == {ir.task_id for ir in like}


def test_failures_are_reported_per_request_and_undo_nothing(servers, ada):
    alpha, beta = servers
    like = asking(alpha, 3)
    dana = make_user("dana", APPROVERS, "team-alpha")
    services.answer_input(input_request=like[1], response={"action": "decline"}, user=dana)
    not_hers = asking(beta, 1)[0]  # a server ada does not approve for: as if it did not exist

    response = answer_like(client_for(ada), [*like, not_hers], action="decline")
    page = response.content.decode()
    assert "Declined 2 requests from alpha" in page
    assert "2 not answered" in page and "dana answered it first" in page
    assert "1 selected request is not among those you may answer" in page
    assert "beta" not in page.split("not answered", 1)[1].split("</div>", 1)[0]
    states = {ir.pk: ir.state for ir in [*like, not_hers] if not ir.refresh_from_db()}
    assert states == {
        like[0].pk: InputRequestState.ANSWERED,
        like[1].pk: InputRequestState.ANSWERED,
        like[2].pk: InputRequestState.ANSWERED,
        not_hers.pk: InputRequestState.OPEN,
    }
    like[1].refresh_from_db()
    assert like[1].answered_by == dana and like[1].answer == {"action": "decline"}
    assert answered_events().count() == 3  # dana's and ada's two


def test_an_answer_that_does_not_fit_the_form_is_shown_again_and_records_nothing(servers, ada):
    like = asking(servers[0], 3)
    response = client_for(ada).post(
        reverse("tasks:answer_like"),
        {"action": "accept", "request": [str(like[0].pk), str(like[2].pk)], ELICITATION.html_prefix + "reason": "no"},
    )
    assert response.status_code == 400
    page = response.content.decode()
    assert page.count("Nothing was answered: please correct the fields marked below.") == 1  # in the group's form
    assert f'Your answer was not recorded: <a href="#like-{likeness(like[0])}">' in page
    group = page.split(f'id="like-{likeness(like[0])}"', 1)[1].split("</section>", 1)[0]
    assert 'value="no"' in group and 'aria-invalid="true"' in group
    assert f'value="{like[0].pk}" checked' in group and f'value="{like[1].pk}">' in group
    assert not answered_events().exists()
    assert all(not ir.refresh_from_db() and ir.state == InputRequestState.OPEN for ir in like)


def test_requests_that_do_not_ask_the_same_thing_are_refused_together(servers, ada):
    first = asking(servers[0], 1)[0]
    other = asking(servers[0], 1, OTHER)[0]
    page = answer_like(client_for(ada), [first, other], action="decline").content.decode()
    assert "do not all ask the same thing; nothing was answered" in page
    page = answer_like(client_for(ada), [], action="decline").content.decode()
    assert "Select at least one request" in page
    assert not answered_events().exists()


def test_the_live_re_fetch_of_the_cards_carries_the_groups(servers, ada):
    like = asking(servers[0], 2)
    fragment = client_for(ada).get(reverse("tasks:inbox"), {"fragment": "cards"}).content.decode()
    assert 'id="inbox-like"' in fragment
    assert f'data-ids="{like[0].pk},{like[1].pk}"' in fragment


def test_every_page_title_leads_with_the_waiting_count_of_an_approver(servers, ada):
    asking(servers[0], 3)
    asking(servers[1], 1)  # not ada's to answer
    client = client_for(ada)
    assert "<title>(3) Inbox · taskhub</title>" in client.get(reverse("tasks:inbox")).content.decode()
    assert "<title>(3) Tasks · taskhub</title>" in client.get(reverse("tasks:list")).content.decode()
    operator = client_for(make_user("olga", OPERATORS))
    assert "<title>Tasks · taskhub</title>" in operator.get(reverse("tasks:list")).content.decode()


def test_each_request_is_checked_on_its_own_by_the_service_and_the_callers_permission(servers, ada):
    like = asking(servers[0], 4)
    services.expire(task=like[1].task)  # the task ended: the service refuses its answer
    refused_by_caller = like[2]
    outcomes = answer_each(
        input_requests=like,
        response={"action": "cancel"},
        user=ada,
        may_answer=lambda ir: ir.pk != refused_by_caller.pk,
    )
    assert [outcome.answered for outcome in outcomes] == [True, False, False, True]
    assert outcomes[1].problem.startswith("The server no longer asks 'q'")
    assert outcomes[2].problem == "You do not approve for the server 'alpha'."
    assert [ir.state for ir in like if not ir.refresh_from_db()] == [
        InputRequestState.ANSWERED,
        InputRequestState.SUPERSEDED,
        InputRequestState.OPEN,
        InputRequestState.ANSWERED,
    ]
    assert answered_events().count() == 2


def test_a_group_answer_follows_each_requests_policy_with_its_comment(servers, ada):
    """Approval policies (issue 16) apply to each request of a group: N of M keeps them open after one acceptance,
    a decline without the comment the policy asks for is refused per request, and the comment goes with each."""
    alpha, _ = servers
    create_policy(
        server=alpha,
        tool="deploy",
        groups=[Group.objects.get(name="team-alpha")],
        required_accepts=2,
        comment_required_on_decline=True,
        user=None,
    )
    like = asking(alpha, 2)
    page = client_for(ada).post(
        reverse("tasks:answer_like"),
        {
            "action": "accept",
            "request": [str(ir.pk) for ir in like],
            ELICITATION.html_prefix + "reason": "release train",
            "comment": "fine by me",
        },
        follow=True,
    )
    assert "Your acceptance is recorded for 2 requests (1 of 2 accepted)" in page.content.decode()
    for ir in like:
        ir.refresh_from_db()
        assert ir.state == InputRequestState.OPEN
        assert [(a["name"], a.get("comment")) for a in ir.acceptances] == [("ada", "fine by me")]

    dana = make_user("dana", APPROVERS, "team-alpha")
    page = answer_like(client_for(dana), like, action="decline").content.decode()
    assert "2 not answered" in page and "A decline needs a comment saying why" in page
    assert all(not ir.refresh_from_db() and ir.state == InputRequestState.OPEN for ir in like)

    client_for(dana).post(
        reverse("tasks:answer_like"),
        {"action": "decline", "request": [str(ir.pk) for ir in like], "comment": "not this week"},
    )
    for ir in like:
        ir.refresh_from_db()
        assert (ir.state, ir.answer, ir.answer_comment) == (
            InputRequestState.ANSWERED,
            {"action": "decline"},
            "not this week",
        )
