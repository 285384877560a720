import uuid

from django.conf import settings
from django.db import models

STATUS_MESSAGE_MAX_CHARS = 4000
TRUNCATION_NOTE = " … [truncated by taskhub]"


class TaskStatus(models.TextChoices):
    # local states, before the server has said anything or after it can no longer say anything
    LAUNCHING = "launching", "launching"
    LAUNCH_UNKNOWN = "launch_unknown", "launch outcome unknown"
    EXPIRED = "expired", "expired"
    # the server's five
    WORKING = "working", "working"
    INPUT_REQUIRED = "input_required", "input required"
    COMPLETED = "completed", "completed"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"


TERMINAL_STATUSES = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.EXPIRED})
# Statuses the tracker follows (a TaskPoll row exists) once the remote task id is known.
LIVE_STATUSES = frozenset({TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED})


class Task(models.Model):
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

    # NULL until known: many tasks may lack it, which the unique constraint allows only for NULL.
    remote_task_id = models.CharField(max_length=500, null=True, blank=True)  # noqa: DJ001
    status = models.CharField(max_length=16, choices=TaskStatus.choices, default=TaskStatus.LAUNCHING)
    status_message = models.TextField(blank=True)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    ttl_ms = models.BigIntegerField(null=True, blank=True)
    poll_interval_ms = models.BigIntegerField(null=True, blank=True)
    remote_created_at = models.CharField(max_length=64, blank=True, help_text="as the server sent it")
    remote_last_updated_at = models.CharField(max_length=64, blank=True, help_text="as the server sent it")
    # MRTR (tools/call answered input_required before any task existed): echoed exactly on the retry;
    # NULL when the server sent none, which differs from an empty string.
    mrtr_request_state = models.TextField(null=True, blank=True)  # noqa: DJ001

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
        )

    def __str__(self) -> str:
        return f"{self.tool} on {self.server_id} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class TaskPoll(models.Model):
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


class InputRequestState(models.TextChoices):
    OPEN = "open", "open"
    ANSWERED = "answered", "answered"
    DELIVERED = "delivered", "delivered"
    SUPERSEDED = "superseded", "superseded"


TASK_PHASE = 0


class InputRequest(models.Model):
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
    delivered_at = models.DateTimeField(null=True, blank=True)
    # Set, and committed, just before each attempt to send an answer (services.claim_delivery): a delivery that
    # finds it set may have reached the server already (the worker stopped before recording the ack), so it waits
    # for that attempt to settle and asks the server before sending again.
    delivery_attempted_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("created_at", "key")
        constraints = (
            models.UniqueConstraint(fields=["task", "mrtr_round", "key"], name="input_request_key_unique_per_task"),
        )
        indexes = (
            models.Index(fields=["state", "created_at"], name="input_request_state_created"),
            models.Index(fields=["server"], condition=models.Q(state="open"), name="input_request_open_server"),
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
