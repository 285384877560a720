"""Every change to a Task or an InputRequest. Views, jobs and the tracker call these; nothing else writes the models.

Each service is one transaction that writes the state, its audit row(s) and the hand-off to a job together
(tasks/hooks.py), and announces the change after commit (tasks/signals.py; the live layer listens). Rows are locked
task first, then input requests. One module per phase of a task's life, as Zulip's zerver/actions/ is split:

- launching: the task written before anything is sent, and what tools/call answered;
- gate: a launch held at the gate before the call until an approval;
- sending: the launch job's bookkeeping (marked sent under the task's lock, failures, retries, an unknown outcome);
- following: the snapshots the tracker reads, the input requests they open, expiry and lost stdio tasks;
- answering: an answer under the request's approval rules (decided in taskhub.approvals);
- delivering: answers and cancels on their way to the server;
- held_questions: a question asked on the session of a call in flight (classic elicitation), held by the worker
  holding the call, answered like any other and sent back on that session;
- session_tasks: a 2025-11-25 task, followed on its session by the worker that launched it (its cancel sent there,
  its follower's death its loss);
- deadlines: what a policy decided for a request nobody answered in time, done;
- cancelling: a cancel before the call, at the gate, or asked of the server;
- retention: finished tasks past their time removed;
- common: what they share (locking, announcing after commit, the status line).

Callers import this package (`from taskhub.tasks import services`); each name below is the phase module's.
"""

from taskhub.tasks.services.answering import (
    COMMENT_MAX_CHARS,
    DEFAULT_ANSWERER,
    answer_input,
    answerer_name,
    locked_for_answer,
)
from taskhub.tasks.services.cancelling import request_cancel
from taskhub.tasks.services.common import (
    LOG_PROBLEM_MAX_CHARS,
    QUOTE_MAX_CHARS,
    SNAPSHOT_FIELDS,
    TERMINAL_FIELDS,
    cap_status_message,
)
from taskhub.tasks.services.deadlines import (
    NO_ANSWER_IN_TIME,
    DeadlineOutcome,
    apply_deadline_default,
    mark_deadline_near,
)
from taskhub.tasks.services.delivering import (
    check_lease,
    claim_delivery,
    first_claim,
    first_claimed,
    hand_answer_to_worker,
    hand_over_answers_the_web_left,
    is_first_send,
    mark_cancel_delivered,
    mark_delivered,
    record_cancel_failure,
    record_delivery_failure,
)
from taskhub.tasks.services.following import (
    LOST_MESSAGE,
    OVER_CAP_MARK,
    apply_snapshot,
    expire,
    mark_lost,
    record_protocol_error_once,
    sent_before,
    snapshot_values,
)
from taskhub.tasks.services.launching import check_launch, launch, launch_sent_by_gateway, record_launch_outcome
from taskhub.tasks.services.retention import purge_finished_tasks
from taskhub.tasks.services.sending import (
    LAUNCH_ATTEMPT_FIELDS,
    LaunchCall,
    cancel_before_remote_task,
    give_up_launch,
    hand_launch_to_worker,
    launch_was_sent,
    mark_launch_sent,
    mark_launch_unknown,
    record_launch_failure,
    record_launch_retry,
    schedule_mrtr_retry,
    withdraw_launch_sent,
)

__all__ = [
    "COMMENT_MAX_CHARS",
    "DEFAULT_ANSWERER",
    "LAUNCH_ATTEMPT_FIELDS",
    "LOG_PROBLEM_MAX_CHARS",
    "LOST_MESSAGE",
    "NO_ANSWER_IN_TIME",
    "OVER_CAP_MARK",
    "QUOTE_MAX_CHARS",
    "SNAPSHOT_FIELDS",
    "TERMINAL_FIELDS",
    "DeadlineOutcome",
    "LaunchCall",
    "answer_input",
    "answerer_name",
    "apply_deadline_default",
    "apply_snapshot",
    "cancel_before_remote_task",
    "cap_status_message",
    "check_launch",
    "check_lease",
    "claim_delivery",
    "expire",
    "first_claim",
    "first_claimed",
    "give_up_launch",
    "hand_answer_to_worker",
    "hand_launch_to_worker",
    "hand_over_answers_the_web_left",
    "is_first_send",
    "launch",
    "launch_sent_by_gateway",
    "launch_was_sent",
    "locked_for_answer",
    "mark_cancel_delivered",
    "mark_deadline_near",
    "mark_delivered",
    "mark_launch_sent",
    "mark_launch_unknown",
    "mark_lost",
    "purge_finished_tasks",
    "record_cancel_failure",
    "record_delivery_failure",
    "record_launch_failure",
    "record_launch_outcome",
    "record_launch_retry",
    "record_protocol_error_once",
    "request_cancel",
    "schedule_mrtr_retry",
    "sent_before",
    "snapshot_values",
    "withdraw_launch_sent",
]
