import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import pgettext_lazy

from taskhub.database.loading import LoadedPlainly

STATUS_MESSAGE_MAX_CHARS = 4000
# How many times the launch job tries to reach a server before the launch fails as never sent (jobs.LAUNCH_RETRY).
LAUNCH_ATTEMPTS = 9
# The `source` of the status change of a task cancelled before its tool call was sent (services.request_cancel).
CANCELLED_NOT_SENT = "cancel before the tool call was sent"
# What a task keeps of why its launch could not reach the server (a transport error's text, from the server side).
LAUNCH_ERROR_MAX_CHARS = 500
TRUNCATION_NOTE = " … [truncated by taskhub]"


class TaskStatus(models.TextChoices):
    # local states, before the server has said anything or after it can no longer say anything
    LAUNCHING = "launching", pgettext_lazy("task status", "launching")
    LAUNCH_UNKNOWN = "launch_unknown", pgettext_lazy("task status", "launch outcome unknown")
    EXPIRED = "expired", pgettext_lazy("task status", "expired")
    # a stdio server's process exited (or its worker died) and the process that replaced it does not know the task
    LOST = "lost", pgettext_lazy("task status", "lost")
    # the server's five
    WORKING = "working", pgettext_lazy("task status", "working")
    INPUT_REQUIRED = "input_required", pgettext_lazy("task status", "input required")
    COMPLETED = "completed", pgettext_lazy("task status", "completed")
    FAILED = "failed", pgettext_lazy("task status", "failed")
    CANCELLED = "cancelled", pgettext_lazy("task status", "cancelled")


TERMINAL_STATUSES = frozenset(
    {TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.EXPIRED, TaskStatus.LOST}
)
# Statuses the tracker follows (a TaskPoll row exists) once the remote task id is known.
LIVE_STATUSES = frozenset({TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED})


class Task(LoadedPlainly, models.Model):
    """One tools/call, whatever the server made of it: a synchronous result, MRTR rounds, or a durable task."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Indexed by the (…, created_at) indexes in Meta, which lead with these columns.
    server = models.ForeignKey("servers.Server", on_delete=models.PROTECT, related_name="tasks", db_index=False)
    tool = models.CharField(max_length=200)
    arguments = models.JSONField(default=dict, blank=True)
    launched_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="launched_tasks",
        db_index=False,
    )
    # The API token (an agent) it was launched with, if any; the label keeps "name (prefix…)" as it was then, so
    # pages and the audit still say which agent after the token is gone. A string reference: tasks never import api.
    launched_via_token = models.ForeignKey(
        "api.ApiToken",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="launched_tasks",
        db_index=False,  # the partial task_token_created index leads with it
    )
    # db_default: rows written by SQL alone (bench/pages.py) need no value either.
    launched_via_label = models.CharField(max_length=130, blank=True, default="", db_default="")

    # NULL until known: many tasks may lack it, which the unique constraint allows only for NULL.
    remote_task_id = models.CharField(max_length=500, null=True, blank=True)  # noqa: DJ001
    status = models.CharField(max_length=16, choices=TaskStatus.choices, default=TaskStatus.LAUNCHING)
    status_message = models.TextField(blank=True)
    # The status message is taskhub's own words (a launch waiting at or stopped by the gate, a task lost, a call cut
    # off), not the server's: pages label it so.
    status_message_is_taskhubs = models.BooleanField(default=False, db_default=False)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    ttl_ms = models.BigIntegerField(null=True, blank=True)
    poll_interval_ms = models.BigIntegerField(null=True, blank=True)
    remote_created_at = models.CharField(max_length=64, blank=True, help_text="as the server sent it")
    # createdAt + ttlMs as the server last said (taskhub/tasks/ttl.py), written with them: NULL when unlimited or
    # unreadable. When taskhub may give the task up, and what Home's "expiring within the hour" counts.
    expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    remote_last_updated_at = models.CharField(max_length=64, blank=True, help_text="as the server sent it")
    # MRTR (tools/call answered input_required before any task existed): echoed exactly on the retry;
    # NULL when the server sent none, which differs from an empty string.
    mrtr_request_state = models.TextField(null=True, blank=True)  # noqa: DJ001
    # A 2025-11-25 task lives on the session that created it: the worker that launched it follows it there (not the
    # tracker) and is named here, so that its death ends the task as lost (heartbeats) rather than leave it live.
    followed_by = models.CharField(max_length=200, blank=True, default="", db_default="")
    # The latest `notifications/progress` of the call in flight (any revision; services.record_progress): shown as a
    # bar while the task is not over. Not audited: progress is no decision.
    progress = models.FloatField(null=True, blank=True)
    progress_total = models.FloatField(null=True, blank=True)
    progress_message = models.CharField(max_length=500, blank=True, default="", db_default="")
    # How many progress reports the task had (status messages alone, `notifications/progress`): its end's audit row
    # says so; each one is in its progress history (ProgressMessage), not in the audit trail.
    progress_updates = models.PositiveIntegerField(default=0, db_default=0)
    # How many lines its server logged during its calls, in all (ServerLogLine keeps the latest): none, and its pages
    # ask for none.
    server_log_lines = models.PositiveIntegerField(default=0, db_default=0)

    # While the launch job cannot reach the server and retries (services.record_launch_retry): how many attempts
    # of the current round failed, why the last one did (untrusted text, capped), and when the next one runs.
    # Reset when the launch gets an outcome, or starts a new (MRTR) round.
    launch_attempts = models.PositiveSmallIntegerField(default=0)
    launch_last_error = models.TextField(blank=True)
    launch_next_try_at = models.DateTimeField(null=True, blank=True)

    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    cancel_delivered_at = models.DateTimeField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-created_at",)
        constraints = (
            models.UniqueConstraint(fields=["server", "remote_task_id"], name="task_remote_id_unique_per_server"),
        )
        # status is included where a filter leads, so the list's tab counts of a server or a launcher are
        # index-only scans. The list's `?q=` search has a trigram index too, task_status_message_trgm, made by
        # migration 0005 only where Postgres has pg_trgm (not the embedded one): it is left out of the state here.
        indexes = (
            models.Index(fields=["status", "-created_at"], name="task_status_created"),
            models.Index(fields=["server", "-created_at"], name="task_server_created", include=["status"]),
            models.Index(fields=["launched_by", "-created_at"], name="task_launcher_created", include=["status"]),
            models.Index(fields=["-created_at"], name="task_created"),
            # The list's agent filter: one token's tasks, and "launched by an agent"; partial, as few tasks have one.
            models.Index(
                fields=["launched_via_token", "-created_at"],
                name="task_token_created",
                include=["status"],
                condition=models.Q(launched_via_token__isnull=False),
            ),
            models.Index(
                fields=["-created_at"],
                name="task_agent_created",
                include=["status"],
                condition=~models.Q(launched_via_label=""),
            ),
            # The home page's outcomes of the last 24 hours and the list's ?ended=.
            models.Index(fields=["finished_at"], name="task_finished", condition=models.Q(finished_at__isnull=False)),
            # The expiry sweep's and Home's "expiring within the hour": the live tasks with a TTL, by their end.
            models.Index(
                fields=["expires_at"],
                name="task_live_expires",
                condition=models.Q(status__in=[TaskStatus.INPUT_REQUIRED.value, TaskStatus.WORKING.value])
                & models.Q(expires_at__isnull=False),
            ),
            # The home page's "cancel requested, still running": the few tasks with a cancel request.
            models.Index(
                fields=["cancel_requested_at"],
                name="task_cancel_requested",
                condition=models.Q(cancel_requested_at__isnull=False),
            ),
        )

    def __str__(self) -> str:
        return f"{self.tool} on {self.server_id} ({self.status})"

    @property
    def launched_by_agent(self) -> bool:
        return bool(self.launched_via_label)

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def shows_progress(self) -> bool:
        return self.progress is not None and not self.is_terminal

    @property
    def progress_words(self) -> str:
        """ "3 of 10", or "3" when the server gave no total."""
        done = f"{self.progress:g}" if self.progress is not None else ""
        return f"{done} of {self.progress_total:g}" if self.progress_total else done

    @property
    def launch_retrying(self) -> bool:
        """Still launching after at least one attempt failed to reach the server."""
        return self.status == TaskStatus.LAUNCHING and self.launch_attempts > 0

    @property
    def launch_attempts_max(self) -> int:
        return LAUNCH_ATTEMPTS

    @property
    def launch_next_try_waits(self) -> bool:
        """The next attempt is still to come (else it is under way, or about to be)."""
        return self.launch_next_try_at is not None and self.launch_next_try_at > timezone.now()


class TaskPoll(LoadedPlainly, models.Model):
    """The tracker's bookkeeping for one live task, apart from the wide Task row.

    Rescheduling changes the indexed next_poll_at on every poll, which is never a HOT update; in this
    narrow table (fillfactor 70, set in the migration) that churn stays cheap and leaves Task alone.
    The row exists only while the task is live and is deleted when it ends.
    """

    task = models.OneToOneField(Task, primary_key=True, on_delete=models.CASCADE, related_name="poll")
    next_poll_at = models.DateTimeField(db_index=True)
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    consecutive_failures = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"poll {self.task_id} at {self.next_poll_at}"


class ServerLogLine(models.Model):
    """A line a server logged (`notifications/message`, any revision) while a call of the task was in flight: shown
    on the task page, the last SERVER_LOG_LINES_KEPT per task, gone with the task. Untrusted text, stored capped and
    shown escaped. Not audit: the audit trail gets one summary per call (services.progress)."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="server_log")
    at = models.DateTimeField()
    level = models.CharField(max_length=16)
    logger = models.CharField(max_length=100, blank=True)
    text = models.TextField()

    class Meta:
        indexes = (models.Index(fields=["task", "at"], name="server_log_task_at"),)

    def __str__(self) -> str:
        return f"{self.level} {self.logger}: {self.text[:80]}"


class ProgressMessage(LoadedPlainly, models.Model):
    """A status message a server reported while the task ran (its status unchanged): the task's progress history, on
    its timeline. Display, not decisions, so not audit (services.progress.keep_progress_message): the newest
    PROGRESS_MESSAGES_KEPT per task and a thinned sample of the older ones, gone with the task."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="progress_messages")
    number = models.PositiveIntegerField(help_text="the task's progress_updates when it came")
    at = models.DateTimeField()
    text = models.TextField()

    class Meta:
        indexes = (models.Index(fields=["task", "number"], name="progress_message_task_number"),)

    def __str__(self) -> str:
        return f"#{self.number} {self.text[:80]}"


class InputRequestState(models.TextChoices):
    OPEN = "open", "open"
    ANSWERED = "answered", "answered"
    DELIVERED = "delivered", "delivered"
    SUPERSEDED = "superseded", "superseded"


TASK_PHASE = 0
# The gate before the call (an approval policy's "needs approval before it runs"): taskhub's own request, answered
# here and never sent to the server; its acceptance sends tools/call, its decline ends the task not approved.
GATE_METHOD = "taskhub/approve_launch"
GATE_KEY = "taskhub:approve-launch"
# error.kind of a task whose launch was not approved at the gate (never sent).
NOT_APPROVED = "not_approved"


class InputRequest(LoadedPlainly, models.Model):
    """One entry of a task's inputRequests, keyed as the server keyed it; shown and answered once.

    `mrtr_round` is 0 for keys of the durable task (answered by tasks/update) and n for the n-th MRTR
    round of the tools/call before any task existed: the spec makes those keys a separate namespace.
    """

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="input_requests")
    # The task's server, copied (save fills it in): the open-request counts of every page's nav and of the inbox
    # filter by server without joining the tasks table. A task never changes server.
    server = models.ForeignKey(
        "servers.Server", on_delete=models.PROTECT, related_name="+", editable=False, db_index=False
    )
    mrtr_round = models.PositiveSmallIntegerField(default=TASK_PHASE)
    key = models.CharField(max_length=500)
    method = models.CharField(max_length=100)
    params = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=12, choices=InputRequestState.choices, default=InputRequestState.OPEN)
    answer = models.JSONField(null=True, blank=True)
    answered_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    answered_at = models.DateTimeField(null=True, blank=True)
    # N of M (the request's approval policy): the acceptances so far, oldest first, while more are needed
    # ([{"user": id, "name": username, "at": ISO time, "content": …}]); the N-th makes the answer. Kept afterwards.
    acceptances = models.JSONField(default=list, blank=True)
    # N of M: earlier acceptances that stopped counting when a later one arrived (their giver no longer allowed by
    # the policy in force then: removed from it, no longer an approver, …), each with "why"; shown on the card.
    discounted_acceptances = models.JSONField(default=list, blank=True)
    # Why the answer was given (a decline's reason); for people and the audit trail, never sent to the server.
    answer_comment = models.TextField(blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    # Set, and committed, just before each attempt to send an answer (services.claim_delivery): a delivery that
    # finds it set may have reached the server already (the worker stopped before recording the ack), so it waits
    # for that attempt to settle and asks the server before sending again.
    delivery_attempted_at = models.DateTimeField(null=True, blank=True)
    # The worker (its heartbeat name) that made that attempt, "" when unknown (run outside `manage.py worker`): once
    # that worker is known dead, its attempt has settled a short grace after its death was found (worker/jobs.py).
    delivery_attempted_by = models.CharField(max_length=200, blank=True, default="", db_default="")
    # The answer deadline of the request's approval policy, fixed when the request opens (a policy edited later moves
    # no deadline already running); NULL: none. At it taskhub applies the policy's default once (default_applied_at),
    # or hands the request to `escalated_to`, whose members answer it from then on. deadline_near_sent_at: the
    # "deadline near" notice went out (once per request).
    answer_deadline_at = models.DateTimeField(null=True, blank=True)
    deadline_near_sent_at = models.DateTimeField(null=True, blank=True)
    default_applied_at = models.DateTimeField(null=True, blank=True)
    escalated_to = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    # A question asked on the session of a call in flight (a classic `elicitation/create`, taskhub.mcp.questions):
    # the worker holding that call, which sends the answer back on the session itself (not a delivery job), and until
    # when it waits for one. Empty for the requests of the Tasks extension and MRTR.
    held_by = models.CharField(max_length=200, blank=True, default="", db_default="")
    held_until = models.DateTimeField(null=True, blank=True)
    # Why a request was closed without its answer reaching the server (a held call that ended, a wait that ran out);
    # the card says it. Empty otherwise ("withdrawn by the server").
    closed_reason = models.TextField(blank=True, default="", db_default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("created_at", "key")
        constraints = (
            models.UniqueConstraint(fields=["task", "mrtr_round", "key"], name="input_request_key_unique_per_task"),
        )
        indexes = (
            models.Index(fields=["state", "created_at"], name="input_request_state_created"),
            # The inbox's open requests per server and the escalation each has (who may answer it): an index-only
            # scan of 100,000 open requests rather than a read of their rows.
            models.Index(
                fields=["server"],
                include=["escalated_to"],
                condition=models.Q(state="open"),
                name="input_request_open_server",
            ),
            # Which servers have an open request escalated to a group (tasks/waiting.py, on every page's nav): few
            # or none, found without reading the open ones.
            models.Index(
                fields=["server"],
                condition=models.Q(state="open", escalated_to__isnull=False),
                name="input_request_open_escalated",
            ),
            # The tasks a person declined (outcomes._declined, settle_outcomes): a few among every answered request,
            # found without reading them all (the outcome filter and each list page asked for them by a scan).
            models.Index(
                fields=["task"],
                condition=models.Q(answer__action="decline"),
                name="input_request_declined",
            ),
            # The deadline sweep: open requests whose deadline is still to act.
            models.Index(
                fields=["answer_deadline_at"],
                condition=models.Q(state="open", answer_deadline_at__isnull=False, default_applied_at__isnull=True),
                name="input_request_open_deadline",
            ),
        )

    def __str__(self) -> str:
        return f"{self.key} of {self.task_id} ({self.state})"

    def save(self, *args, **kwargs):
        if self.server_id is None:
            self.server_id = self.task.server_id
        super().save(*args, **kwargs)

    @property
    def mode(self) -> str | None:
        """For elicitation: "form" (also when absent) or "url"."""
        if self.method != "elicitation/create":
            return None
        return (self.params or {}).get("mode") or "form"


def has_input_requests() -> models.Exists:
    """Whether the task of the outer query's row has input requests, whatever their state: the one definition of a
    task whose changes the inbox's pages hear of (the worker knows it from its locked read, the publish looks it up)."""
    return models.Exists(InputRequest.objects.filter(task_id=models.OuterRef("pk")))


def has_input_requests_sql(task_alias: str) -> str:
    """has_input_requests() in a hand-written statement whose task table is aliased `task_alias`."""
    return f'EXISTS(SELECT 1 FROM "{InputRequest._meta.db_table}" r WHERE r.task_id = {task_alias}.id)'


def may_have_input_requests(task: Task) -> bool:
    """False only for a task read with `asks` (has_input_requests) false: it has none, and nothing need ask for them.
    True for a task read without it."""
    return getattr(task, "asks", True)
