"""A person's (or an agent's) answer to an input request, under the request's approval rules."""

import functools
from typing import Any

from django.db import connection, transaction
from django.utils import timezone
from django.utils.translation import gettext

from taskhub.accounts import permissions
from taskhub.audit.services import WEB, record_event
from taskhub.database.prepared import prepared_cursor
from taskhub.observability import tracing
from taskhub.servers.models import Server
from taskhub.tasks import hooks, storable_text
from taskhub.tasks.answers import validate_response
from taskhub.tasks.errors import (
    AlreadyAnswered,
    AnswerRejected,
    InputNoLongerOpen,
    PolicyRefused,
)
from taskhub.tasks.models import (
    GATE_METHOD,
    InputRequest,
    InputRequestState,
    Task,
)
from taskhub.tasks.services.common import _name, _publish_after_commit
from taskhub.tasks.services.delivering import is_first_send, request_task_server_columns, with_task_and_server
from taskhub.tasks.services.gate import _pass_gate


def locked_for_answer(*, input_request_id: int) -> InputRequest:
    """The input request with its task and server, locked for answering until the caller's transaction ends
    (InputRequest.DoesNotExist if there is none). answer_input reads it so; a view that must read the request
    before it answers (to check who may, to read the form) reads it with this, in a transaction around both, and
    passes `locked=True`: answer_input does not read it again, one statement less before the answer is stored.

    Lock order task → input request, as apply_snapshot does; the second of two answers waits here. One statement:
    Postgres locks the rows of `FOR UPDATE OF` in the order it names them (the task's, then the request's). Only
    locked rows are read again when a lock was waited for, so who answered (or the escalation group) is not joined
    here: the rare paths that show them read them after the lock.

    What `select_for_update(no_key=True, of=("task", "self")).select_related("task__server").get(pk=…)` reads, in a
    statement written once: every answer begins here, and through the ORM it took 1.1-1.5 ms more before the answer
    was stored (bench/answer_path.py, POST → stored: 5.95 and 5.12 ms then, 4.45 and 4.04 now)."""
    with prepared_cursor() as cursor:
        cursor.execute(_locked_for_answer_sql(), [input_request_id])
        row = cursor.fetchone()
    if row is None:
        raise InputRequest.DoesNotExist(f"Input request {input_request_id} does not exist.")
    return with_task_and_server(row)


@functools.cache
def _locked_for_answer_sql() -> str:
    return (
        f"SELECT {request_task_server_columns()} "
        f'FROM "{InputRequest._meta.db_table}" AS request '
        f'JOIN "{Task._meta.db_table}" AS task ON task.id = request.task_id '
        f'JOIN "{Server._meta.db_table}" AS server ON server.id = task.server_id '
        "WHERE request.id = %s FOR NO KEY UPDATE OF task, request"
    )


@tracing.traced("taskhub.answer.submit", attributes=tracing.answer_attributes, result_attributes=tracing.answered)
def answer_input(
    *,
    input_request: InputRequest,
    response: dict[str, Any],
    user,
    comment: str = "",
    token=None,
    as_agent: bool = False,
    locked: bool = False,
    caller_sends: bool = False,
) -> InputRequest:
    """Record one person's answer; the delivery job sends it. One answer per key, whoever clicks first. `token`: the API
    token (an agent) it came through, named in the audit rows.

    In a transaction of its own (a savepoint inside the caller's), where it reads the request locked; or with
    `locked`, in the caller's, where the caller read it with locked_for_answer: an error raised here then ends
    the caller's transaction too (it must not go on in it), which has changed nothing before.

    The request's approval policy (permissions.answer_terms) applies here, whichever page or API calls: who may
    answer, self-approval, a comment on decline, and N of M, where an acceptance before the N-th is recorded (the
    request stays open) and only the N-th makes the answer sent; a decline or a cancel by any of them ends it.
    `as_agent`: the gateway passes a request through to the agent that made the call (no policy applies, or its
    policy says `input_from` agent): `user` is that agent, whose one answer is the answer; the rules about people
    do not apply.

    `caller_sends`: the caller sends the answer itself as this commits, on a client it keeps (taskhub/gateway/
    sending.py). Where it can (a first task-phase answer, not a held question's), the answer is claimed here for the
    web process (`sent_by_caller` on the request returned), and no delivery job is deferred: should the caller stop
    before recording what came back, the minute's sweep finds the claim grown old and hands the answer to the
    delivery job (delivering.hand_over_answers_the_web_left), which asks the server whether it arrived, as after a
    worker that stopped. Otherwise the delivery job sends it."""
    answering = dict(
        response=response, user=user, comment=comment, token=token, as_agent=as_agent, caller_sends=caller_sends
    )
    if locked:
        if not connection.in_atomic_block:  # the caller's transaction ended, and its lock with it
            raise transaction.TransactionManagementError("locked=True: read with locked_for_answer in this transaction")
        return _answer(input_request=input_request, **answering)
    with transaction.atomic():
        return _answer(input_request=locked_for_answer(input_request_id=input_request.pk), **answering)


def _answer(
    *,
    input_request: InputRequest,
    response: dict[str, Any],
    user,
    comment: str,
    token,
    as_agent: bool,
    caller_sends: bool,
) -> InputRequest:
    task = input_request.task
    input_request.sent_by_caller = False
    if input_request.state in (InputRequestState.ANSWERED, InputRequestState.DELIVERED):
        raise AlreadyAnswered(
            key=input_request.key,
            answered_by=answerer_name(input_request),
            answered_at=input_request.answered_at,
        )
    if input_request.state == InputRequestState.SUPERSEDED:
        raise InputNoLongerOpen(
            gettext("The server no longer asks %(key)s; the answer was not recorded.")
            % {"key": repr(input_request.key)}
        )
    if task.is_terminal:
        raise InputNoLongerOpen(
            gettext("The task is %(status)s; it takes no more answers.") % {"status": task.get_status_display()}
        )
    if task.server.removed_at is not None:
        raise InputNoLongerOpen(
            gettext("The server %(server)s was removed; it takes no more answers.") % {"server": repr(task.server.name)}
        )
    _refuse_unstorable_answer(response)
    answer = validate_response(
        method=input_request.method,
        params=input_request.params,
        response=response,
        held=bool(input_request.held_by),
    )
    comment = _checked_comment(comment)
    terms = permissions.answer_terms(server_id=task.server_id, tool=task.tool)
    if not as_agent:
        refusal = permissions.answer_refusal(
            input_request=input_request, answer=answer, user=user, terms=terms, comment=comment
        )
        if refusal:
            raise PolicyRefused(refusal)
    now = timezone.now()
    answered = {
        "key": input_request.key,
        "mrtr_round": input_request.mrtr_round,
        "answer": answer,
        **({"policy": terms.policy_id} if terms.policy_id is not None else {}),
        **({"answered_as": "agent"} if as_agent else {}),
    }
    commented = {"comment": comment} if comment else {}
    required = 1
    if answer.get("action", "accept") == "accept" and not as_agent:  # a sampling reply has no action: it accepts
        count = permissions.count_acceptance(
            input_request=input_request, terms=terms, acceptance=_acceptance(user, answer, now, comment)
        )
        required, input_request.acceptances = count.required, count.acceptances
        if count.discounted:
            _record_discounted(task, input_request, count.discounted, answered=answered, user=user, token=token)
        if not count.enough:
            input_request.save(update_fields=["acceptances", "discounted_acceptances"])
            record_event(
                action="input.accepted",
                user=user,
                task=task,
                data={**answered, "accepted": len(count.acceptances), "required": required, **commented},
                token=token,
            )
            _publish_after_commit(task.id, server_id=task.server_id, asks=True)
            input_request.task = task
            input_request.answer_terms = terms  # the card shows them without reading the policy again
            return input_request
    input_request.state = InputRequestState.ANSWERED
    input_request.answer = answer
    input_request.answered_by = user
    input_request.answered_at = now
    input_request.answer_comment = comment
    input_request.sent_by_caller = caller_sends and _sendable_at_once(input_request)
    if input_request.sent_by_caller:
        input_request.delivery_attempted_at = now
        input_request.delivery_attempted_by = WEB
        input_request.trace_context = tracing.carrier()  # the caller's send continues this trace, as the job would
    input_request.save(
        update_fields=[
            "state",
            "answer",
            "answered_by",
            "answered_at",
            "answer_comment",
            "acceptances",
            "discounted_acceptances",
            *(["delivery_attempted_at", "delivery_attempted_by"] if input_request.sent_by_caller else []),
        ]
    )
    accepted_by = [entry.get("name") for entry in input_request.acceptances]
    record_event(
        action="input.answered",
        user=user,
        task=task,
        data={
            **answered,
            **({"accepted_by": accepted_by, "required": required} if accepted_by else {}),
            **commented,
        },
        token=token,
    )
    if input_request.method == GATE_METHOD:
        _pass_gate(task, input_request, user=user, comment=comment, token=token)
    elif not input_request.sent_by_caller:
        hooks.hand_over_answer(input_request, server=task.server)
    # An answer the caller sends has no job: its claim is what the sweep finds should the caller stop. A delivery job
    # deferred for later as its fallback cost the send 1.5-2 ms (bench/approval.py: the job's row, procrastinate's
    # event row, and the job cancelled once the answer was sent).
    _publish_after_commit(task.id, server_id=task.server_id, asks=True)
    input_request.task = task  # as locked, with its server: the caller shows the answered card without reading again
    input_request.answer_terms = terms
    return input_request


def _sendable_at_once(input_request: InputRequest) -> bool:
    """Whether an answer may be sent by the web process as it commits: a first attempt at a task-phase answer
    (tasks/update) to a task the server runs, not a gate's (a launch) nor a held question's (the worker holding the
    call sends it on that call's session)."""
    return input_request.method != GATE_METHOD and not input_request.held_by and is_first_send(input_request)


def _record_discounted(task: Task, input_request: InputRequest, discounted: list[dict], *, answered, user, token):
    """N of M: earlier acceptances the policy in force no longer allows stop counting; the card and the audit trail
    say whose and why."""
    input_request.discounted_acceptances = [*input_request.discounted_acceptances, *discounted]
    record_event(
        action="input.acceptances_discounted",
        user=user,
        task=task,
        data={
            "key": answered["key"],
            "mrtr_round": answered["mrtr_round"],
            **({"policy": answered["policy"]} if "policy" in answered else {}),
            "discounted": [{"name": entry.get("name"), "why": entry.get("why")} for entry in discounted],
        },
        token=token,
    )


COMMENT_MAX_CHARS = 2000


def _checked_comment(comment: str) -> str:
    comment = (comment or "").strip()
    if len(comment) > COMMENT_MAX_CHARS:
        raise AnswerRejected(
            gettext("The comment is too long: at most %(count)s characters.") % {"count": COMMENT_MAX_CHARS}
        )
    problem = storable_text.value_problem(comment)
    if problem:
        raise AnswerRejected(f"The comment {problem}.")
    return comment


def _acceptance(user, answer, now, comment: str) -> dict[str, Any]:
    entry = {"user": user.pk, "name": user.get_username(), "at": now.isoformat()}
    if "content" in answer:
        entry["content"] = answer["content"]
    if comment:
        entry["comment"] = comment
    return entry


def _refuse_unstorable_answer(response: Any) -> None:
    content = response.get("content") if isinstance(response, dict) else None
    unstorable = storable_text.unstorable_fields(content) if isinstance(content, dict) else {}
    if not unstorable:
        problem = storable_text.value_problem(response)
        unstorable = {"": f"The answer {problem}."} if problem else {}
    if unstorable:
        raise AnswerRejected(gettext("The answer contains text that cannot be stored."), unstorable)


DEFAULT_ANSWERER = "taskhub, at the deadline"


def answerer_name(input_request: InputRequest) -> str:
    """Who gave a request's answer: a person, or taskhub when it applied the policy's default at the deadline."""
    if input_request.answered_by_id is None and input_request.default_applied_at is not None:
        return DEFAULT_ANSWERER
    return _name(input_request.answered_by)
