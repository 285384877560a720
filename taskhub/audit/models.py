from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.db.models.fields.json import KT
from django.utils import timezone
from django.utils.translation import gettext, gettext_noop

from taskhub.audit.events import AUDIT_EVENTS
from taskhub.database.loading import LoadedPlainly


def agent_label(facts: dict | None) -> str:
    """How pages name an agent (an API token) from what the audit and a task keep of it: "CI pipeline (thk_Ab12Cd…)";
    "" for none."""
    if not isinstance(facts, dict) or not facts.get("prefix"):
        return ""
    return f"{str(facts.get('name', ''))[:100]} ({str(facts['prefix'])[:16]}…)"


# taskhub's own actors (not people), translated where pages show them.
OWN_ACTORS = frozenset({gettext_noop("system"), gettext_noop("worker"), gettext_noop("gateway"), gettext_noop("web")})


class AuditEvent(LoadedPlainly, models.Model):
    """One row per state change or human action; a database trigger refuses UPDATE and DELETE. Stored in monthly
    partitions (the primary key is (id, time) in the database), each month one hash chain (migration 0009).

    The foreign keys have no database constraint and `DO_NOTHING` on delete: deleting a user, a server
    or (retention) an old task must never touch audit rows, which the trigger would refuse anyway. The
    column keeps the id of what was deleted; `event.task_id` stays readable, `event.task` then raises
    DoesNotExist, so audit views use the ids and the labels in `data`.
    """

    time = models.DateTimeField(default=timezone.now)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    actor_label = models.CharField(max_length=150, help_text='username, or "system" / "worker"')
    # Checked against the registry (taskhub/audit/events.py) when recorded, not by `choices`: a new event
    # type should not need a migration.
    action = models.CharField(max_length=64)
    task = models.ForeignKey(
        "tasks.Task",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,  # the (…, time) indexes below lead with it
        related_name="audit_events",
    )
    server = models.ForeignKey(
        "servers.Server",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,  # the (…, time) indexes below lead with it
        related_name="audit_events",
    )
    data = models.JSONField(default=dict, blank=True)
    # Set by the database when the row is sealed after its commit (migration 0011's audit_seal), NULL until then
    # whatever an INSERT gives: its place in the chains (within a month, seq order is chain order), the hash of the
    # month's previous row (32 zero bytes for its first) and sha256(prev_hash + this row's content). audit/chain.py
    # seals and verifies them.
    seq = models.BigIntegerField(null=True, editable=False)
    prev_hash = models.BinaryField(null=True, editable=False)
    hash = models.BinaryField(null=True, editable=False)

    class Meta:
        indexes = (
            models.Index(fields=["task", "time"], name="audit_task_time"),
            models.Index(fields=["server", "time"], name="audit_server_time"),
            models.Index(fields=["time"], name="audit_time"),
            # The audit page's agent filter (data["agent"], record_event's `token`): partial, as most rows have none.
            models.Index(
                KT("data__agent__token_id"),
                F("time").desc(),
                name="audit_agent_time",
                condition=Q(data__has_key="agent"),
            ),
            models.Index(F("time").desc(), name="audit_any_agent_time", condition=Q(data__has_key="agent")),
            # The audit page's default: people's actions (a user acted), newest first.
            models.Index(F("time").desc(), name="audit_people_time", condition=Q(actor__isnull=False)),
            # Home's "protocol errors in the last 24 hours" (tasks.queries.needs_filter): through the day's few, not
            # every event of the day (7.7 ms at bench/pages.py's million tasks, on each operator's Home).
            models.Index(fields=["time"], name="audit_protocol_error_time", condition=Q(action="task.protocol_error")),
        )

    def __str__(self) -> str:
        return f"{self.time:%Y-%m-%d %H:%M:%S} {self.actor_label} {self.action}"

    @property
    def agent(self) -> str:
        """The API token (agent) the action came through, as pages name it; "" for none."""
        return agent_label(self.data.get("agent") if isinstance(self.data, dict) else None)

    @property
    def description(self) -> str:
        return AUDIT_EVENTS.get(self.action, self.action)

    @property
    def shown_description(self) -> str:
        return shown_description(self.action)

    @property
    def shown_actor(self) -> str:
        return shown_actor(self.actor_label)


def shown_description(action: str) -> str:
    """An action's description in the reader's language (the export and the API keep the registry's English)."""
    return gettext(AUDIT_EVENTS.get(action, action))


def shown_actor(actor_label: str) -> str:
    """An actor as a page names it: a username as it is, taskhub's own actors in the reader's language."""
    return gettext(actor_label) if actor_label in OWN_ACTORS else actor_label
