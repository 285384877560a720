import datetime
import json
import re
import uuid

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils.dateparse import parse_duration
from django.utils.translation import gettext, pgettext_lazy
from django.utils.translation import gettext_lazy as _
from encrypted_fields.fields import EncryptedJSONField, EncryptedTextField

from taskhub.database.loading import LoadedPlainly
from taskhub.tasks import storable_text

MAX_REQUIRED_ACCEPTS = 20
# An answer deadline between a second (tests, demos) and thirty days.
MIN_ANSWER_WITHIN = datetime.timedelta(seconds=1)
MAX_ANSWER_WITHIN = datetime.timedelta(days=30)
# What a fixed answer may weigh, as JSON.
DEADLINE_ANSWER_MAX_CHARS = 10_000


DURATION_UNITS = {
    "s": 1, "sec": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
    # as a person reading taskhub in Chinese writes them (the form's help shows these)
    "秒": 1, "分": 60, "分钟": 60, "小时": 3600, "天": 86400,
}  # fmt: skip


def parse_answer_within(text: str) -> datetime.timedelta | None:
    """ "30 min", "2 s", "4h", "1 day", "4 小时" (or Django's "hh:mm:ss") as a duration; "" is None; ValueError if
    unreadable."""
    text = (text or "").strip().lower()
    if not text:
        return None
    match = re.fullmatch(r"(\d{1,7})\s*([a-z]+|[秒分钟小时天]+)", text)
    if match and match.group(2) in DURATION_UNITS:
        return datetime.timedelta(seconds=int(match.group(1)) * DURATION_UNITS[match.group(2)])
    duration = parse_duration(text)
    if duration is None:
        raise ValueError(f"{text[:40]!r} is not a duration: write e.g. 30 min, 2 h, 1 day, 45 s.")
    return duration


def say_duration(duration: datetime.timedelta | None) -> str:
    """A duration the way parse_answer_within reads it back: "30 min", "2 h", "90 s"."""
    if duration is None:
        return ""
    seconds = int(duration.total_seconds())
    for unit, size in (("day", 86400), ("h", 3600), ("min", 60)):
        if seconds % size == 0 and seconds >= size:
            count = seconds // size
            return f"{count} {unit}{'s' if unit == 'day' and count != 1 else ''}"
    return f"{seconds} s"


class AtDeadline(models.TextChoices):
    """What taskhub does when nobody answered a request in time."""

    DECLINE = "decline", _("decline the request")
    CANCEL = "cancel", _("cancel the task")
    ANSWER = "answer", _("send a fixed answer")
    ESCALATE = "escalate", _("hand it to an escalation group")


class InputFrom(models.TextChoices):
    """Who answers a server's requests for a call an agent made through the gateway (taskhub/gateway)."""

    PEOPLE = "people", _("people (the policy's approvers, in the inbox)")
    AGENT = "agent", _("the agent that made the call (passed through)")


class ApprovalPolicy(LoadedPlainly, models.Model):
    """Who answers the input requests of a server's tasks, and on what terms. `tool` empty: the server's policy, for
    every tool without a policy of its own; a tool's policy replaces the server's for that tool (nothing is merged).
    A server or tool without any policy is answered by every approver, by one of them, self-approval allowed.

    Who: approvers in one of `groups` or named in `users`; neither set means every approver. Answering stays for
    approvers (taskhub.accounts.permissions): a named user who is not one answers nothing."""

    server = models.ForeignKey("servers.Server", on_delete=models.CASCADE, related_name="approval_policies")
    tool = models.CharField(max_length=200, blank=True, help_text="empty: every tool of the server without its own")
    groups = models.ManyToManyField(Group, blank=True, related_name="approval_policies")
    users = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="approval_policies")
    required_accepts = models.PositiveSmallIntegerField(
        default=1,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_REQUIRED_ACCEPTS)],
        help_text="how many different people must accept before the answer is sent (N of M)",
    )
    allow_self_approval = models.BooleanField(
        default=False, help_text="the person who launched the task may answer its requests"
    )
    comment_required_on_decline = models.BooleanField(default=False, help_text="a decline must say why")
    gate_before_call = models.BooleanField(
        default=False,
        help_text="a launch is not sent until it is approved",
    )
    # The answer deadline, counted from when each request opens and fixed on the request then
    # (InputRequest.answer_deadline_at): editing it later moves no deadline already running.
    answer_within = models.DurationField(
        null=True, blank=True, help_text="how long a request may wait for an answer; empty: no deadline"
    )
    at_deadline = models.CharField(
        max_length=10, choices=AtDeadline.choices, default=AtDeadline.DECLINE, help_text="what happens at the deadline"
    )
    # The fixed answer (an ElicitResult: {"action": "accept", "content": {...}}), checked against each request's
    # requestedSchema when it is applied (a request it does not fit is declined instead, and the audit says why).
    deadline_answer = models.JSONField(null=True, blank=True)
    escalation_group = models.ForeignKey(
        Group, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", help_text="answers it after"
    )
    input_from = models.CharField(
        max_length=8,
        choices=InputFrom.choices,
        default=InputFrom.PEOPLE,
        help_text="for calls through the gateway: who answers the server's requests",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("server__name", "tool")
        constraints = (models.UniqueConstraint(fields=["server", "tool"], name="approval_policy_one_per_tool"),)
        verbose_name_plural = "approval policies"

    def __str__(self) -> str:
        return f"{self.server.name} · {self.tool}" if self.tool else f"{self.server.name} (every tool)"

    @property
    def shown_name(self) -> str:
        """What __str__ says, in the reader's language (a tool's name is a name)."""
        return str(self) if self.tool else gettext("%(server)s (every tool)") % {"server": self.server.name}

    def clean(self) -> None:
        problems = []
        if self.answer_within is not None:
            if not MIN_ANSWER_WITHIN <= self.answer_within <= MAX_ANSWER_WITHIN:
                problems.append("The answer deadline must be between 1 second and 30 days.")
            if self.at_deadline == AtDeadline.ESCALATE and self.escalation_group_id is None:
                problems.append("Escalating at the deadline needs an escalation group.")
            if self.at_deadline == AtDeadline.ANSWER:
                problem = deadline_answer_problem(self.deadline_answer)
                if problem:
                    problems.append(problem)
        if problems:
            raise ValidationError(problems)


def deadline_answer_problem(answer) -> str:
    """What is wrong with the shape of a fixed answer ("" when nothing): an ElicitResult whose content holds only
    the values a form field takes. Whether it fits a request's form is checked when it is applied."""
    if not isinstance(answer, dict):
        return 'The fixed answer must be a JSON object, e.g. {"action": "accept", "content": {"approved": false}}.'
    unstorable = storable_text.value_problem(answer)
    if unstorable:
        return f"The fixed answer {unstorable}."
    if len(json.dumps(answer)) > DEADLINE_ANSWER_MAX_CHARS:
        return f"The fixed answer is too long: at most {DEADLINE_ANSWER_MAX_CHARS} characters of JSON."
    unknown = sorted(set(answer) - {"action", "content"})
    if unknown:
        return f"The fixed answer has keys an answer does not have: {', '.join(unknown)}."
    if answer.get("action") not in ("accept", "decline", "cancel"):
        return 'The fixed answer\'s "action" must be "accept", "decline" or "cancel".'
    content = answer.get("content")
    if answer["action"] != "accept":
        return "" if content is None else "Only an accepting fixed answer carries content."
    if content is None:
        return ""  # consent to a URL-mode request, or a form without fields
    if not isinstance(content, dict):
        return 'The fixed answer\'s "content" must be an object of field values.'
    for name, value in content.items():
        scalar = isinstance(value, str | int | float | bool)
        if not scalar and not (isinstance(value, list) and all(isinstance(item, str) for item in value)):
            return f"The fixed answer's field {name!r} must be text, a number, true/false or a list of texts."
    return ""


class WebhookFormat(models.TextChoices):
    JSON = "json", _("JSON, signed")
    SLACK = "slack", _("Slack text")


class WebhookEvent(models.TextChoices):
    REQUEST_WAITING = "request.waiting", _("a request waits for an answer")
    DEADLINE_NEAR = "request.deadline_near", _("a request's deadline is near")
    DEFAULT_APPLIED = "request.default_applied", _("a default was applied at the deadline")


class PolicyWebhook(models.Model):
    """An address taskhub POSTs to when something happens to a request under `policy` (approvals.webhooks).

    The secret signs each body (HMAC-SHA256) and is encrypted at rest like servers' credentials; no page, API or
    audit row shows it again. The URL is checked against the servers' address policy when saved and at each POST."""

    policy = models.ForeignKey(ApprovalPolicy, on_delete=models.CASCADE, related_name="webhooks")
    # Without its secrets, as a server's URL (a secret query value is ***): see approvals.webhooks.
    url = models.URLField(max_length=2000)
    url_secrets = EncryptedJSONField(default=dict, blank=True)  # the secret query values, by parameter
    # The library stores an empty value as NULL; a Slack-format webhook may have none (Slack checks no signature).
    secret = EncryptedTextField(null=True, blank=True)
    format = models.CharField(max_length=8, choices=WebhookFormat.choices, default=WebhookFormat.JSON)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("policy", "pk")

    def __str__(self) -> str:
        return f"{self.get_format_display()} webhook to {self.url}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", pgettext_lazy("webhook delivery", "sending")
    DELIVERED = "delivered", pgettext_lazy("webhook delivery", "delivered")
    FAILED = "failed", pgettext_lazy("webhook delivery", "gave up")
    CANCELLED = "cancelled", pgettext_lazy("webhook delivery", "not sent: webhook turned off")


class WebhookDelivery(models.Model):
    """One event for one webhook, and how its delivery goes. Its id is the X-Taskhub-Delivery header (receivers
    dedupe on it); `body` is built when the event happens, so every attempt sends the same bytes."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    webhook = models.ForeignKey(PolicyWebhook, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=40, choices=WebhookEvent.choices)
    # The request it is about; the delivery log outlives it (retention deletes finished tasks).
    input_request = models.ForeignKey(
        "tasks.InputRequest", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    body = models.JSONField()
    status = models.CharField(max_length=12, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    # What the receiver answered or what went wrong, cut short: it is the receiver's text, untrusted.
    last_error = models.TextField(blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    next_try_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("-created_at",)
        indexes = (models.Index(fields=["webhook", "-created_at"], name="webhook_delivery_recent"),)
        verbose_name_plural = "webhook deliveries"

    def __str__(self) -> str:
        return f"{self.event} to webhook {self.webhook_id} ({self.status})"


class NotificationKind(models.TextChoices):
    """What a person may be told by mail; each is a switch on their preferences page."""

    REQUEST_WAITING = "request_waiting", "a request waits for me"
    DEADLINE_NEAR = "deadline_near", "a request's answer deadline is near"
    DEFAULT_APPLIED = "default_applied", "a default was applied to a request I could answer"
    TASK_FINISHED = "task_finished", "a task I launched finished"
    # To every admin with an address, without a switch: a server waits for one of them to connect it again, and the
    # launches and answers for it wait with it (issue 33).
    SERVER_NEEDS_AUTHORIZATION = "server_needs_authorization", "a server needs an admin to connect it again"


# The kinds a person turns on and off (each a field of NotificationPreferences).
SWITCHED_KINDS = tuple(kind.value for kind in NotificationKind if kind != NotificationKind.SERVER_NEEDS_AUTHORIZATION)


class NotificationPreferences(models.Model):
    """Which events reach one person by mail. Created on first save: a person without a row has the defaults."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True, related_name="notification_preferences"
    )
    request_waiting = models.BooleanField(default=True)
    deadline_near = models.BooleanField(default=True)
    default_applied = models.BooleanField(default=True)
    task_finished = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "notification preferences"

    def __str__(self) -> str:
        return f"notification preferences of user {self.user_id}"

    def wants(self, kind: str) -> bool:
        return bool(getattr(self, kind)) if kind in SWITCHED_KINDS else True


class MailEventQuerySet(models.QuerySet):
    def waiting(self) -> "MailEventQuerySet":
        """Neither sent nor given up: what the next digest carries."""
        return self.filter(sent_at__isnull=True, gave_up_at__isnull=True)


class MailEvent(models.Model):
    """The mail outbox: one row per event per person, until a digest carries it (`sent_at`). A digest that fails
    leaves its rows unsent, so the next try carries them, unless the mail server refused the address for good (a 5xx
    reply to it) or the tries were used up (`gave_up_at`, the reason in `last_error`)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="mail_events")
    kind = models.CharField(max_length=32, choices=NotificationKind.choices)
    task = models.ForeignKey("tasks.Task", on_delete=models.CASCADE, null=True, related_name="+")
    input_request = models.ForeignKey("tasks.InputRequest", on_delete=models.CASCADE, null=True, related_name="+")
    # What the event adds: the deadline, what taskhub did at it, how the task ended.
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    failures = models.PositiveIntegerField(default=0)
    last_error = models.CharField(max_length=500, blank=True)
    gave_up_at = models.DateTimeField(null=True, blank=True)

    objects = MailEventQuerySet.as_manager()

    class Meta:
        indexes = (
            models.Index(
                fields=["user", "created_at"],
                condition=models.Q(sent_at__isnull=True, gave_up_at__isnull=True),
                name="mail_event_waiting",
            ),
            models.Index(fields=["user", "sent_at"], name="mail_event_sent"),
        )
        constraints = (
            # A request is announced to a person once per kind, however often the signal repeats.
            models.UniqueConstraint(
                fields=["user", "kind", "input_request"],
                condition=models.Q(input_request__isnull=False),
                name="mail_event_once_per_request",
            ),
        )

    def __str__(self) -> str:
        return f"{self.kind} for user {self.user_id}" + (" (sent)" if self.sent_at else "")
