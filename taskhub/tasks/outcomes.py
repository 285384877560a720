"""What became of each task, as the task list, its filters, Home, the API and /metrics say it: an outcome (completed,
failed, declined, …) from its status and result, and the facts of a row (error code and kind, a result preview).

The one definition of "declined": a task that ended (completed, failed or cancelled) after a person declined one of
its questions, or that the gate before the call stopped (not approved: declined, cancelled or left unanswered by its
deadline). A server may well answer a decline with an ordinary result (the demo's `approval` does): it is declined
all the same, not "completed".
"""

import copy
import json
from functools import cache

from django.db.models import (
    BooleanField,
    CharField,
    Count,
    Exists,
    ExpressionWrapper,
    OuterRef,
    Q,
    QuerySet,
    Value,
)
from django.db.models.fields.json import KT, KeyTransform
from django.db.models.functions import Left
from django.utils.translation import pgettext_lazy

from taskhub.database.prepared import prepared_cursor
from taskhub.tasks.models import NOT_APPROVED, InputRequest, Task, TaskStatus, may_have_input_requests


class Outcome:
    COMPLETED = "completed"
    COMPLETED_ERROR = "completed_error"
    DECLINED = "declined"
    CANCELLED = "cancelled"
    FAILED = "failed"
    LOST = "lost"
    EXPIRED = "expired"
    UNKNOWN = "launch_unknown"


# value, words, the statuses it can come from
OUTCOMES = (
    (Outcome.COMPLETED, pgettext_lazy("outcome", "completed"), (TaskStatus.COMPLETED,)),
    (Outcome.COMPLETED_ERROR, pgettext_lazy("outcome", "completed with error"), (TaskStatus.COMPLETED,)),
    (
        Outcome.DECLINED,
        pgettext_lazy("outcome", "declined"),
        (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED),
    ),
    (Outcome.CANCELLED, pgettext_lazy("outcome", "cancelled"), (TaskStatus.CANCELLED,)),
    (Outcome.FAILED, pgettext_lazy("outcome", "failed"), (TaskStatus.FAILED,)),
    (Outcome.LOST, pgettext_lazy("outcome", "lost"), (TaskStatus.LOST,)),
    (Outcome.EXPIRED, pgettext_lazy("outcome", "expired"), (TaskStatus.EXPIRED,)),
    (Outcome.UNKNOWN, pgettext_lazy("outcome", "launch outcome unknown"), (TaskStatus.LAUNCH_UNKNOWN,)),
)
OUTCOME_WORDS = {value: words for value, words, _ in OUTCOMES}
OUTCOME_STATUSES = {value: statuses for value, _, statuses in OUTCOMES}
ENDED_STATUSES = tuple(dict.fromkeys(status for _, _, statuses in OUTCOMES for status in statuses))


DECLINABLE_STATUSES = (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED)


def _not_approved() -> Q:
    return Q(error__contains={"kind": NOT_APPROVED})


def _declined() -> Q:
    """A person declined one of the task's input requests, or the gate before the call stopped it."""
    return Q(Exists(InputRequest.objects.filter(task=OuterRef("pk"), answer__action="decline"))) | _not_approved()


def is_error_filter() -> Q:
    # `@>` is false, not NULL, where the key is missing (`result -> 'isError' = true` would be NULL there).
    return Q(result__contains={"isError": True})


DECLINABLE_OUTCOMES = frozenset({Outcome.COMPLETED, Outcome.COMPLETED_ERROR, Outcome.FAILED, Outcome.CANCELLED})


def settle_outcomes(tasks: list[Task]) -> list[Task]:
    """Gives each task of with_row_facts (or with_row_facts_of) its outcome, "declined" by a person included: one
    query for the page's tasks that ended as a decline may have ended them."""
    for task in tasks:
        task.outcome = _row_outcome(task)
    # A task that has no input request has none that could have declined it.
    candidates = {
        task.pk: task for task in tasks if task.outcome in DECLINABLE_OUTCOMES and may_have_input_requests(task)
    }
    if candidates:
        with prepared_cursor() as cursor:
            cursor.execute(_declined_among_sql(), [list(candidates)])
            for (task_id,) in cursor.fetchall():
                candidates[task_id].outcome = Outcome.DECLINED
    return tasks


@cache
def _declined_among_sql() -> str:
    """Of these tasks, those with an input request a person declined (_declined's rule: the answer's JSON action is
    the string "decline"); one statement prepared on the server, where the ORM's query took longer to build than
    Postgres to answer (the list page asks it on every request)."""
    requests = InputRequest._meta
    task, answer = requests.get_field("task").column, requests.get_field("answer").column
    return (
        f'SELECT DISTINCT "{task}" FROM "{requests.db_table}" '
        f"""WHERE "{task}" = ANY(%s) AND "{answer}" -> 'action' = '"decline"'::jsonb"""
    )


def _row_outcome(task: Task) -> str:
    """The outcome from the row's status and facts, but a person's decline (settle_outcomes asks for those): stopped
    at the gate is "declined", a completed result with isError (JSON true) "completed_error", "" while it runs."""
    if task.error_kind == NOT_APPROVED and task.status in DECLINABLE_STATUSES:
        return Outcome.DECLINED
    if task.status == TaskStatus.COMPLETED and task.result_is_error is True:
        return Outcome.COMPLETED_ERROR
    return next((outcome for outcome, status in _OUTCOME_OF_STATUS if task.status == status), "")


def outcome_of(task: Task) -> str:
    """One task's outcome, by the same rule (the API's task)."""
    return settle_outcomes([with_row_facts_of(task)])[0].outcome


def outcome_filter(outcome: str) -> Q:
    """The tasks whose outcome (settle_outcomes, for a row) is `outcome`."""
    declined = _declined()
    if outcome == Outcome.COMPLETED:
        return Q(status=TaskStatus.COMPLETED) & ~is_error_filter() & ~declined
    if outcome == Outcome.COMPLETED_ERROR:
        return Q(status=TaskStatus.COMPLETED) & is_error_filter() & ~declined
    if outcome == Outcome.DECLINED:
        return Q(status__in=DECLINABLE_STATUSES) & declined
    if outcome in (Outcome.CANCELLED, Outcome.FAILED):
        return Q(status=outcome) & ~declined
    return Q(status__in=OUTCOME_STATUSES[outcome])


def outcome_counts(ended: QuerySet[Task]) -> dict[str, int]:
    """How many of `ended` had each outcome (settle_outcomes' rule), from one plain aggregate (outcome_counts_per): per
    status and declined or not, with its isError results. (Grouping by the outcome's CASE costs a subplan per row.)"""
    return outcome_counts_per(ended).get(None) or _outcomes_of({}, {})


def outcome_counts_per(ended: QuerySet[Task], *, per=None) -> dict:
    """outcome_counts grouped by the expression `per` too (Home's hours and days, a Trunc of finished_at): {its value:
    {outcome: count}}, for the values that have tasks; `per=None`: one group, None. One statement (outcome_rows)."""
    return outcome_counts_of_rows(outcome_rows(ended, per=per))


def outcome_rows(ended: QuerySet[Task], *, per=None) -> QuerySet:
    """The statement of outcome_counts_per: the tasks per group, status and whether they were declined
    (outcome_filter's rule, looked up once per task), with their isError results; outcome_counts_of_rows sums them."""
    declined = ExpressionWrapper(Q(status__in=DECLINABLE_STATUSES) & _declined(), output_field=BooleanField())
    rows = ended.order_by().annotate(
        per=per if per is not None else Value(None, output_field=CharField()), declined=declined
    )
    return rows.values_list("per", "status", "declined").annotate(
        n=Count("*"), errors=Count("pk", filter=Q(status=TaskStatus.COMPLETED) & is_error_filter())
    )


def outcome_counts_of_rows(rows) -> dict:
    """{group: {outcome: count}} of outcome_rows' rows."""
    every: dict = {}
    declined_ones: dict = {}
    for group, status, was_declined, n, errors in rows:
        counts = every.setdefault(group, {})
        before_n, before_errors = counts.get(status, (0, 0))
        counts[status] = (before_n + n, before_errors + errors)
        if was_declined:
            declined_ones.setdefault(group, {})[status] = (n, errors)
    return {group: _outcomes_of(counts, declined_ones.get(group, {})) for group, counts in every.items()}


def _outcomes_of(every: dict, declined: dict) -> dict[str, int]:
    def total(counts, status):
        return counts.get(status, (0, 0))[0]

    errors = every.get(TaskStatus.COMPLETED, (0, 0))[1]
    declined_errors = declined.get(TaskStatus.COMPLETED, (0, 0))[1]
    declined_completed = total(declined, TaskStatus.COMPLETED)
    return {
        Outcome.COMPLETED: total(every, TaskStatus.COMPLETED) - errors - (declined_completed - declined_errors),
        Outcome.COMPLETED_ERROR: errors - declined_errors,
        Outcome.DECLINED: sum(n for n, _ in declined.values()),
        Outcome.CANCELLED: total(every, TaskStatus.CANCELLED) - total(declined, TaskStatus.CANCELLED),
        Outcome.FAILED: total(every, TaskStatus.FAILED) - total(declined, TaskStatus.FAILED),
        Outcome.LOST: total(every, TaskStatus.LOST),
        Outcome.EXPIRED: total(every, TaskStatus.EXPIRED),
    }


PREVIEW_CHARS = 200


def with_row_facts(tasks: QuerySet[Task]) -> QuerySet[Task]:
    """What a row of the list shows beyond the columns: the error code and kind, the first text of the result (at
    most PREVIEW_CHARS, cut by Postgres so the big JSON never leaves the database), and whether the result says
    isError; settle_outcomes works the outcome out from them after the read. (A CASE of the outcome in the query cost
    more to build than the rest of the query: bench/pages.py.)"""
    return tasks.annotate(
        error_code=Left(KT("error__code"), 40),
        error_kind=Left(KT("error__kind"), 40),  # "not_approved": the gate before the call said no (approvals)
        result_preview=Left(KT("result__content__0__text"), PREVIEW_CHARS),
        result_is_error=KeyTransform("isError", "result"),  # JSON: true, not the string "true", is an error
    )


# What a row of the list shows (the task-row partial): the big JSON columns (arguments, result, error) stay behind.
ROW_FIELDS = (
    "status",
    "status_message",
    "progress",
    "progress_total",
    "tool",
    "cancel_requested_at",
    "launch_attempts",
    "launch_last_error",
    "launch_next_try_at",
    "created_at",
    "updated_at",
    "finished_at",
    "server__name",
    "launched_by__username",
    "launched_via_label",
    "cancel_requested_by__username",
)
ROW_FACTS = ("error_code", "error_kind", "result_preview", "result_is_error")


def with_row_facts_of(task: Task) -> Task:
    """A copy of a task read whole, with with_row_facts's annotations worked out in Python from its columns: the live
    list signal has the task already, and building with_row_facts's query cost more than the rest of the signal
    (bench/answer_path.py). test_tasks_pages holds the two to the same values."""
    row = copy.copy(task)
    result, error = task.result, task.error
    row.error_code = _json_text(error, "code", limit=40)
    row.error_kind = _json_text(error, "kind", limit=40)
    content = result.get("content") if isinstance(result, dict) else None
    first = content[0] if isinstance(content, list) and content else None
    row.result_preview = _json_text(first, "text", limit=PREVIEW_CHARS)
    row.result_is_error = result.get("isError") if isinstance(result, dict) else None
    return row


_OUTCOME_OF_STATUS = (
    (Outcome.COMPLETED, TaskStatus.COMPLETED),
    (Outcome.CANCELLED, TaskStatus.CANCELLED),
    (Outcome.FAILED, TaskStatus.FAILED),
    (Outcome.LOST, TaskStatus.LOST),
    (Outcome.EXPIRED, TaskStatus.EXPIRED),
    (Outcome.UNKNOWN, TaskStatus.LAUNCH_UNKNOWN),
)


def _json_text(value, key: str, *, limit: int) -> str | None:
    """Postgres's `left(value ->> key, limit)`: the text of a JSON object's member (NULL for JSON null)."""
    if not isinstance(value, dict) or value.get(key) is None:
        return None
    member = value[key]
    # Other than a string, the member's JSON, as Postgres writes scalars and lists (an object's keys may come in
    # another order).
    return (member if isinstance(member, str) else json.dumps(member, ensure_ascii=False))[:limit]
