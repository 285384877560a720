"""Approval policies in the answer service: who answers, N of M, self-approval, a comment on decline; and the
inbox's view of them ("for: …", "for me"), and the migration of the servers' approver groups."""

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.http import QueryDict
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from taskhub.accounts import permissions
from taskhub.accounts.groups import APPROVERS
from taskhub.approvals.models import ApprovalPolicy
from taskhub.approvals.services import PolicyInvalid, create_policy, remove_policy, update_policy
from taskhub.audit.models import AuditEvent
from taskhub.mcp.client import TaskCreated
from taskhub.mcp.wire import TaskSnapshot
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.errors import AlreadyAnswered, PolicyRefused
from taskhub.tasks.inbox_listing import inbox_listing
from taskhub.tasks.input_cards import card_for
from taskhub.tasks.models import GATE_METHOD, InputRequest, InputRequestState, Task
from taskhub.tasks.outcomes import settle_outcomes, with_row_facts
from taskhub.web.templatetags.taskhub_ui import outcome_badge
from tests.catalogue_fixtures import with_tools

FORM = {
    "method": "elicitation/create",
    "params": {
        "message": "Ship it?",
        "requestedSchema": {"type": "object", "properties": {"note": {"type": "string"}}},
    },
}
ACCEPT = {"action": "accept", "content": {"note": "ok"}}


def open_request(server, *, tool="deploy", launched_by=None) -> InputRequest:
    task = services.launch(server=with_tools(server, tool), tool=tool, arguments={}, user=launched_by)
    snapshot = TaskSnapshot.model_validate(
        {"taskId": f"r-{task.id}", "status": "input_required", "inputRequests": {"q": FORM}, "ttlMs": None}
    )
    services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot))
    return InputRequest.objects.select_related("task__server").get(task=task, key="q")


@pytest.fixture
def server(db):
    return create_server(name="demo", transport="http", url="http://127.0.0.1:8765/mcp", user=None)


@pytest.fixture
def people(django_user_model):
    approvers = Group.objects.get(name=APPROVERS)
    made = {}
    for name in ("olga", "pete", "quinn", "rosa"):
        made[name] = django_user_model.objects.create_user(name)
        made[name].groups.add(approvers)
    return made


def deliveries(input_request) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM procrastinate_jobs"
            " WHERE task_name = 'taskhub.deliver_answer' AND args->>'input_request_id' = %s",
            [str(input_request.pk)],
        )
        return cursor.fetchone()[0]


def test_two_of_three_sends_one_answer_only_after_the_second_acceptance(server, people):
    policy = create_policy(
        server=server, users=[people["olga"], people["pete"], people["quinn"]], required_accepts=2, user=None
    )
    request = open_request(server)

    partly = services.answer_input(input_request=request, response=ACCEPT, user=people["olga"])
    assert partly.state == InputRequestState.OPEN and [a["name"] for a in partly.acceptances] == ["olga"]
    assert deliveries(request) == 0
    card = card_for(InputRequest.objects.select_related("task__server").get(pk=request.pk), people["pete"])
    assert card.accepted_by == ["olga"] and card.required_accepts == 2 and card.answerers == "olga, pete, quinn"

    with pytest.raises(PolicyRefused, match="accepted this request already"):
        services.answer_input(input_request=request, response=ACCEPT, user=people["olga"])
    with pytest.raises(PolicyRefused, match="olga accepted with other values"):
        services.answer_input(
            input_request=request, response={"action": "accept", "content": {"note": "no"}}, user=people["pete"]
        )

    done = services.answer_input(input_request=request, response=ACCEPT, user=people["pete"])
    assert done.state == InputRequestState.ANSWERED and done.answered_by == people["pete"]
    assert deliveries(request) == 1
    events = list(
        AuditEvent.objects.filter(task=request.task, action__in=["input.accepted", "input.answered"]).order_by("id")
    )
    assert [(e.action, e.actor_label) for e in events] == [("input.accepted", "olga"), ("input.answered", "pete")]
    assert events[0].data["accepted"] == 1 and events[0].data["required"] == 2 and events[0].data["policy"] == policy.pk
    assert events[1].data["accepted_by"] == ["olga", "pete"]
    with pytest.raises(AlreadyAnswered):
        services.answer_input(input_request=request, response=ACCEPT, user=people["quinn"])


def test_an_approver_removed_from_the_policy_after_accepting_no_longer_counts_toward_n(server, people):
    """Issue 30, item 3: N of M re-checks every acceptance against the policy in force when another arrives."""
    policy = create_policy(
        server=server, users=[people["olga"], people["pete"], people["quinn"]], required_accepts=2, user=None
    )
    request = open_request(server)
    services.answer_input(input_request=request, response=ACCEPT, user=people["olga"])
    update_policy(policy=policy, user=None, users=[people["pete"], people["quinn"]])

    still_open = services.answer_input(input_request=request, response=ACCEPT, user=people["pete"])

    assert still_open.state == InputRequestState.OPEN and [a["name"] for a in still_open.acceptances] == ["pete"]
    assert deliveries(request) == 0
    card = card_for(InputRequest.objects.select_related("task__server").get(pk=request.pk), people["quinn"])
    assert card.accepted_by == ["pete"]
    assert card.no_longer_counting == [
        f"olga's acceptance no longer counts: the approval policy of {policy} no longer names them (only pete, quinn)"
    ]
    (discounted,) = AuditEvent.objects.filter(task=request.task, action="input.acceptances_discounted")
    assert discounted.actor_label == "pete" and discounted.data["policy"] == policy.pk
    assert [entry["name"] for entry in discounted.data["discounted"]] == ["olga"]
    assert "no longer names them" in discounted.data["discounted"][0]["why"]

    done = services.answer_input(input_request=request, response=ACCEPT, user=people["quinn"])
    assert done.state == InputRequestState.ANSWERED and deliveries(request) == 1
    answered = AuditEvent.objects.get(task=request.task, action="input.answered")
    assert answered.data["accepted_by"] == ["pete", "quinn"]


def test_an_acceptance_by_someone_no_longer_an_approver_no_longer_counts(server, people):
    create_policy(server=server, users=[], required_accepts=2, user=None)
    request = open_request(server)
    services.answer_input(input_request=request, response=ACCEPT, user=people["olga"])
    people["olga"].groups.remove(Group.objects.get(name=APPROVERS))

    still_open = services.answer_input(input_request=request, response=ACCEPT, user=people["pete"])

    assert still_open.state == InputRequestState.OPEN
    assert [entry["why"] for entry in still_open.discounted_acceptances] == ["they are no longer an approver"]


def test_a_decline_by_one_of_them_ends_it_and_is_sent(server, people):
    create_policy(server=server, required_accepts=2, user=None)
    request = open_request(server)
    services.answer_input(input_request=request, response=ACCEPT, user=people["olga"])
    declined = services.answer_input(input_request=request, response={"action": "decline"}, user=people["pete"])
    assert declined.state == InputRequestState.ANSWERED and declined.answer == {"action": "decline"}
    assert deliveries(request) == 1
    card = card_for(InputRequest.objects.select_related("task__server").get(pk=request.pk), people["olga"])
    assert card.accepted_by == ["olga"]


def test_the_launcher_may_not_answer_unless_the_policy_allows_it(server, people, client):
    policy = create_policy(server=server, user=None)
    request = open_request(server, launched_by=people["olga"])
    with pytest.raises(PolicyRefused, match=r"You launched this task.*rule: no self-approval"):
        services.answer_input(input_request=request, response=ACCEPT, user=people["olga"])
    assert not AuditEvent.objects.filter(task=request.task, action="input.answered").exists()
    # Issue 34 item 4: the launcher's card says so instead of offering a form the answer service would refuse.
    card = card_for(InputRequest.objects.select_related("task__server").get(pk=request.pk), people["olga"])
    assert not card.may_answer and not card.answerable and card.barred_as_launcher
    assert card_for(InputRequest.objects.select_related("task__server").get(pk=request.pk), people["pete"]).may_answer
    client.force_login(people["olga"])
    inbox = client.get("/inbox/").text
    answer_url = reverse("tasks:answer", args=[request.pk])
    assert "You launched this task, and" in inbox and f'action="{answer_url}"' not in inbox
    update_policy(policy=policy, user=None, allow_self_approval=True)
    assert card_for(InputRequest.objects.select_related("task__server").get(pk=request.pk), people["olga"]).may_answer
    assert services.answer_input(input_request=request, response=ACCEPT, user=people["olga"]).state == "answered"


def test_without_a_policy_the_launcher_answers_as_before(server, people):
    request = open_request(server, launched_by=people["olga"])
    assert services.answer_input(input_request=request, response=ACCEPT, user=people["olga"]).state == "answered"


def test_a_decline_needs_a_comment_where_the_policy_says_so(server, people):
    create_policy(server=server, comment_required_on_decline=True, user=None)
    request = open_request(server)
    with pytest.raises(PolicyRefused, match="A decline needs a comment"):
        services.answer_input(input_request=request, response={"action": "decline"}, user=people["olga"])
    declined = services.answer_input(
        input_request=request, response={"action": "decline"}, user=people["olga"], comment="  wrong branch "
    )
    assert declined.answer_comment == "wrong branch"
    assert AuditEvent.objects.get(task=request.task, action="input.answered").data["comment"] == "wrong branch"


def test_only_the_people_a_policy_names_answer_and_a_tools_policy_replaces_the_servers(server, people):
    finance = Group.objects.create(name="finance")
    people["rosa"].groups.add(finance)
    create_policy(server=server, groups=[finance], user=None)
    create_policy(server=server, tool="deploy", users=[people["olga"]], user=None)
    deploy, other = open_request(server, tool="deploy"), open_request(server, tool="report")

    assert permissions.may_answer(people["olga"], deploy) and not permissions.may_answer(people["rosa"], deploy)
    assert permissions.may_answer(people["rosa"], other) and not permissions.may_answer(people["olga"], other)
    assert not permissions.may_answer(people["pete"], deploy) and not permissions.may_answer(people["pete"], other)
    with pytest.raises(PolicyRefused, match=r"Only finance may answer"):
        services.answer_input(input_request=other, response=ACCEPT, user=people["olga"])

    def listed(user, **params):
        query = QueryDict(mutable=True)
        query.update(params)
        return [ir.pk for ir in inbox_listing(user, query).requests]

    assert listed(people["olga"]) == [deploy.pk] and listed(people["rosa"]) == [other.pk]
    assert listed(people["pete"]) == []
    assert card_for(deploy, people["olga"]).answerers == "olga"
    assert card_for(other, people["rosa"]).answerers == "finance"


def requests_under_every_shape_of_policy(server, people) -> dict[str, InputRequest]:
    finance = Group.objects.create(name="finance")
    people["rosa"].groups.add(finance)
    people["quinn"].groups.add(finance)
    requests = {tool: open_request(server, tool=tool) for tool in ("open", "by-user", "by-group", "both", "server")}
    create_policy(server=server, groups=[finance], user=None)  # the server's, for "server"
    create_policy(server=server, tool="open", user=None)  # names nobody: every approver
    create_policy(server=server, tool="by-user", users=[people["olga"]], user=None)
    create_policy(server=server, tool="by-group", groups=[finance], users=[], user=None, required_accepts=2)
    create_policy(server=server, tool="both", groups=[finance], users=[people["pete"]], user=None)
    other = create_server(name="other", transport="http", url="http://127.0.0.1:8766/mcp", user=None)
    requests["no policy"] = open_request(other)
    return requests


def test_who_may_answer_is_the_same_in_the_permission_check_and_in_the_mails(server, people):
    # may_answer asks one plain statement (approvals.rules), the mails users_who_may_answer's ORM filter: for each
    # shape of policy they choose the same people.
    requests = requests_under_every_shape_of_policy(server, people)
    chosen = {}
    for tool, request in requests.items():
        mailed = set(
            permissions.users_who_may_answer(server_id=request.task.server_id, tool=request.task.tool).values_list(
                "username", flat=True
            )
        )
        checked = {name for name, user in people.items() if permissions.may_answer(user, request)}
        assert checked == mailed, tool
        chosen[tool] = checked
    assert chosen == {
        "open": {"olga", "pete", "quinn", "rosa"},
        "by-user": {"olga"},
        "by-group": {"quinn", "rosa"},
        "both": {"pete", "quinn", "rosa"},
        "server": {"quinn", "rosa"},
        "no policy": {"olga", "pete", "quinn", "rosa"},
    }


def test_a_page_of_requests_reads_their_rules_at_once_and_each_answers_as_read_alone(server, people):
    # The inbox reads the terms of every card's policy, and whether it names the approver, in one query
    # (permissions.read_answer_rules); each card's questions are then answered from it as one by one.
    requests = requests_under_every_shape_of_policy(server, people)
    pairs = [(request.task.server_id, request.task.tool) for request in requests.values()]

    def rules_of(user):
        return {
            tool: (
                permissions.answer_terms(server_id=request.task.server_id, tool=request.task.tool),
                permissions.policy_allows(user, server_id=request.task.server_id, tool=request.task.tool),
            )
            for tool, request in requests.items()
        }

    for name, user in people.items():
        alone = rules_of(user)
        with permissions.read_once():
            with CaptureQueriesContext(connection) as read:
                permissions.read_answer_rules(user, pairs)
            with CaptureQueriesContext(connection) as after:
                at_once = rules_of(user)
        assert len(read.captured_queries) == 1 and after.captured_queries == [], name
        assert at_once == alone, name
    assert alone["by-group"][0].required_accepts == 2 and alone["no policy"][0].policy_id is None


def test_for_me_keeps_the_requests_whose_policy_names_me(server, people, django_user_model):
    other_server = create_server(name="other", transport="http", url="http://127.0.0.1:8766/mcp", user=None)
    create_policy(server=server, users=[people["olga"]], user=None)
    named, anyones = open_request(server), open_request(other_server)
    query = QueryDict("mine=1")
    assert [ir.pk for ir in inbox_listing(people["olga"], QueryDict()).requests] == [named.pk, anyones.pk]
    assert [ir.pk for ir in inbox_listing(people["olga"], query).requests] == [named.pk]
    assert card_for(anyones, people["olga"]).answerers == "all approvers"


def test_policy_changes_are_audited_and_one_policy_per_tool(server, people):
    policy = create_policy(server=server, users=[people["olga"]], required_accepts=2, user=people["rosa"])
    with pytest.raises(PolicyInvalid, match="has a policy for every tool already"):
        create_policy(server=server, user=None)
    with pytest.raises(PolicyInvalid):
        create_policy(server=server, tool="x", required_accepts=0, user=None)
    update_policy(policy=policy, user=people["rosa"], required_accepts=3)
    remove_policy(policy=policy, user=people["rosa"])
    actions = list(
        AuditEvent.objects.filter(server=server, action__startswith="approval_policy")
        .order_by("id")
        .values_list("action", "data")
    )
    assert [a for a, _ in actions] == ["approval_policy.created", "approval_policy.updated", "approval_policy.removed"]
    assert actions[0][1]["users"] == ["olga"] and actions[1][1]["changed"] == {"required_accepts": 3}
    assert not ApprovalPolicy.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_migration_moves_approver_groups_into_policies():
    executor = MigrationExecutor(connection)
    before = [("approvals", "0001_initial"), ("servers", "0007_server_name_unique_in_use")]
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    group = old.get_model("auth", "Group").objects.create(name="deployers")
    grouped = old.get_model("servers", "Server").objects.create(name="a", transport="http", url="http://127.0.0.1:1/m")
    old.get_model("servers", "Server").objects.create(name="b", transport="http", url="http://127.0.0.1:2/m")
    grouped.approver_groups.add(group)

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
    policies = list(ApprovalPolicy.objects.prefetch_related("groups"))
    assert [(p.server.name, p.tool, [g.name for g in p.groups.all()], p.allow_self_approval) for p in policies] == [
        ("a", "", ["deployers"], True)
    ]


# --- the gate before the call -----------------------------------------------------------------------------------


def launch_jobs(task) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE task_name = 'taskhub.launch_task' AND args->>'task_id' = %s",
            [str(task.pk)],
        )
        return cursor.fetchone()[0]


def gated_launch(server, people, **policy):
    create_policy(server=server, tool="deploy", gate_before_call=True, user=None, **policy)
    task = services.launch(
        server=with_tools(server, "deploy"), tool="deploy", arguments={"target": "prod"}, user=people["olga"]
    )
    return task, InputRequest.objects.select_related("task__server").get(task=task, method=GATE_METHOD)


def test_a_gated_launch_is_not_sent_until_approved(server, people):
    task, gate = gated_launch(server, people)
    assert launch_jobs(task) == 0 and gate.state == InputRequestState.OPEN
    card = card_for(gate, people["pete"])
    assert card.kind == "gate" and card.answerable and '"target": "prod"' in card.gate_arguments
    with pytest.raises(PolicyRefused, match="no self-approval"):
        services.answer_input(input_request=gate, response={"action": "accept"}, user=people["olga"])
    assert launch_jobs(task) == 0

    passed = services.answer_input(input_request=gate, response={"action": "accept"}, user=people["pete"])
    assert passed.state == InputRequestState.DELIVERED and launch_jobs(task) == 1
    assert deliveries(gate) == 0  # nothing to tell the server: the launch is the answer
    task.refresh_from_db()
    assert task.status == "launching" and task.status_message == ""
    assert AuditEvent.objects.filter(task=task, action="task.launch_approved", actor_label="pete").exists()


def test_a_declined_launch_ends_not_approved_and_is_never_sent(server, people):
    task, gate = gated_launch(server, people, comment_required_on_decline=True)
    with pytest.raises(PolicyRefused, match="needs a comment"):
        services.answer_input(input_request=gate, response={"action": "decline"}, user=people["pete"])
    services.answer_input(input_request=gate, response={"action": "decline"}, user=people["pete"], comment="not today")
    task.refresh_from_db()
    assert task.status == "failed" and task.error == {
        "message": "not approved: declined by pete (not today)",
        "kind": "not_approved",
    }
    assert launch_jobs(task) == 0
    assert AuditEvent.objects.get(task=task, action="task.not_approved").data == {
        "action": "decline",
        "comment": "not today",
    }
    [row] = settle_outcomes([with_row_facts(Task.objects.filter(pk=task.pk)).get()])
    # The list's and home's word, as the filter's: declined (issue 34, item 3).
    assert 'data-outcome="declined">declined</span> <span class="outcome-detail">at the gate' in outcome_badge(row)


def test_a_gated_launch_cancelled_before_its_approval_ends_here(server, people):
    task, gate = gated_launch(server, people)
    services.request_cancel(task=task, user=people["olga"])
    task.refresh_from_db()
    gate.refresh_from_db()
    assert task.status == "cancelled" and gate.state == InputRequestState.SUPERSEDED and launch_jobs(task) == 0
