"""Outgoing webhooks of approval policies: their settings, the events that queue a delivery, and each attempt.

An event (a request under a policy waits, its deadline is near, a default was applied) writes one WebhookDelivery
per enabled webhook of the policy and defers one job per delivery, in one transaction. The job (taskhub.worker.
webhooks) asks `start_attempt` what to send, POSTs it with `post` and hands the outcome to `record_attempt`, which
decides: 2xx delivered; 4xx other than 408 and 429 given up at once; 5xx, 408, 429, a timeout or a connection
error tried again later with backoff, up to TASKHUB_WEBHOOK_ATTEMPTS attempts, then given up. Giving up is audited
once.

What is signed: the bytes `<timestamp>.<body>` (the X-Taskhub-Timestamp header, a dot, the raw body) with
HMAC-SHA256 and the webhook's secret; X-Taskhub-Signature is `sha256=<hex>`. `verify_signature` is the receiver's
side (and the README's).
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import hmac
import json
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx2
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext

from taskhub import backoff
from taskhub.approvals import hooks
from taskhub.approvals.models import (
    ApprovalPolicy,
    DeliveryStatus,
    PolicyWebhook,
    WebhookDelivery,
    WebhookEvent,
    WebhookFormat,
)
from taskhub.approvals.rules import effective_policy
from taskhub.audit.services import WORKER, record_event, storable
from taskhub.mcp.address_policy import AddressRefused
from taskhub.mcp.outbound import Outbound
from taskhub.mcp.secret_urls import masked_parameters, split_secrets, with_secrets
from taskhub.servers.policy import server_address_policy
from taskhub.tasks.models import InputRequest, InputRequestState

MESSAGE_MAX_CHARS = 500
NAME_MAX_CHARS = 200
ERROR_MAX_CHARS = 300
# A receiver's answer is read this far at most, for the delivery log; the rest is never read.
RESPONSE_MAX_BYTES = 4096
SECRET_MAX_CHARS = 500
RETRY_CAP_SECONDS = 3600.0
# procrastinate's retry counter must not stop a delivery before its own count of attempts does (a retry for a
# worker that stopped, or a database error, is a job attempt too): the delivery row decides when to give up.
JOB_ATTEMPTS_SLACK = 5


class WebhookInvalid(Exception):
    """The webhook cannot be saved as asked; the message is meant for the admin."""


# --- settings: one transaction each, with its audit row ------------------------------------------------


def origin(url: str) -> str:
    """scheme://host[:port] of a URL: what audit rows show (a Slack webhook's path is its credential)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}"


def describe_webhook(webhook: PolicyWebhook) -> dict[str, Any]:
    """What audit rows say of a webhook: never its secret, nor its URL's path."""
    return {
        "id": webhook.pk,
        "policy": webhook.policy_id,
        "to": origin(webhook.url),
        "format": webhook.format,
        "enabled": webhook.enabled,
        "secret": "set" if webhook.secret else "not set",
    }


def _keep_url_secrets(webhook: PolicyWebhook, *, stored: dict[str, list[str]]) -> None:
    """The URL's secret query values out of the `url` column (shown on the policy page, in the API, in audit rows),
    as a server's are: stored encrypted in `url_secrets`, *** in their place; a *** typed back keeps the stored
    value. A secret is never named in an error, only its parameter."""
    try:
        public, _, typed = split_secrets(webhook.url)
    except ValueError:
        return  # _check says the URL is not valid
    secrets: dict[str, list[str]] = {}
    for name in dict.fromkeys(masked_parameters(public)):
        values = typed.get(name) or list(stored.get(name) or [])
        if not values:
            raise WebhookInvalid(
                gettext("The value of the URL's %(name)s parameter is hidden (***): type it.") % {"name": name}
            )
        secrets[name] = values
    webhook.url, webhook.url_secrets = public, secrets


def sent_to(webhook: PolicyWebhook) -> str:
    """The URL a delivery is POSTed to: the stored one with its secret query values back."""
    return with_secrets(webhook.url, dict(webhook.url_secrets or {}))


def _check(webhook: PolicyWebhook) -> None:
    try:
        webhook.full_clean(exclude=["policy"])
    except ValidationError as invalid:
        raise WebhookInvalid(" ".join(invalid.messages)) from invalid
    if urlsplit(webhook.url).scheme not in ("http", "https"):
        raise WebhookInvalid(gettext("A webhook URL starts with http:// or https://."))
    if urlsplit(webhook.url).username is not None:
        raise WebhookInvalid(
            gettext("A webhook URL carries no user or password; the secret signs each delivery instead.")
        )
    try:
        server_address_policy().check_url(webhook.url, resolve=True)
    except AddressRefused as refused:
        raise WebhookInvalid(gettext("Not an address for webhooks: %(why)s.") % {"why": refused}) from refused
    if len(webhook.secret or "") > SECRET_MAX_CHARS:
        raise WebhookInvalid(gettext("The secret is longer than %(count)s characters.") % {"count": SECRET_MAX_CHARS})
    if webhook.format == WebhookFormat.JSON and not webhook.secret:
        raise WebhookInvalid(
            gettext("A JSON webhook needs a secret: receivers check each delivery's signature with it.")
        )


@transaction.atomic
def create_webhook(
    *, policy: ApprovalPolicy, url: str, secret: str = "", format: str = WebhookFormat.JSON, enabled: bool = True, user
) -> PolicyWebhook:
    webhook = PolicyWebhook(
        policy=policy, url=(url or "").strip(), secret=(secret or "").strip() or None, format=format, enabled=enabled
    )
    _check(webhook)
    _keep_url_secrets(webhook, stored={})
    webhook.save()
    record_event(
        action="approval_webhook.created",
        user=user,
        server=policy.server,
        data=describe_webhook(webhook),
    )
    return webhook


@transaction.atomic
def update_webhook(
    *,
    webhook: PolicyWebhook,
    user,
    url: str | None = None,
    secret: str | None = None,
    format: str | None = None,
    enabled: bool | None = None,
) -> PolicyWebhook:
    """Change what is given (None: unchanged). A secret, once set, is replaced, never shown."""
    webhook = PolicyWebhook.objects.select_for_update(no_key=True).select_related("policy__server").get(pk=webhook.pk)
    before, url_before = describe_webhook(webhook), webhook.url
    secret_replaced = secret is not None and (secret or "").strip() != (webhook.secret or "")
    stored_secrets = dict(webhook.url_secrets or {})
    if url is not None:
        webhook.url = url.strip()
    if secret is not None:
        webhook.secret = secret.strip() or None
    if format is not None:
        webhook.format = format
    if enabled is not None:
        webhook.enabled = enabled
    _check(webhook)
    _keep_url_secrets(webhook, stored=stored_secrets)
    webhook.save()
    after = describe_webhook(webhook)
    changed = {name: value for name, value in after.items() if before[name] != value}
    if webhook.url != url_before:
        changed["to"] = after["to"]
    if webhook.url_secrets != stored_secrets:
        changed["url secrets"] = "replaced"
    if secret_replaced:
        changed["secret"] = "replaced"
    if changed:
        record_event(
            action="approval_webhook.updated",
            user=user,
            server=webhook.policy.server,
            data={"id": webhook.pk, "policy": webhook.policy_id, "changed": changed},
        )
    return webhook


@transaction.atomic
def remove_webhook(*, webhook: PolicyWebhook, user) -> None:
    webhook = PolicyWebhook.objects.select_for_update(no_key=True).select_related("policy__server").get(pk=webhook.pk)
    record_event(
        action="approval_webhook.removed", user=user, server=webhook.policy.server, data=describe_webhook(webhook)
    )
    webhook.delete()


# --- events: one delivery per enabled webhook, with its job ---------------------------------------------


def task_url(task_id: uuid.UUID | str) -> str:
    return f"{settings.TASKHUB_BASE_URL}{reverse('tasks:detail', args=[task_id])}"


def _cut(value: Any, limit: int) -> str:
    text = storable(value if isinstance(value, str) else "" if value is None else str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def payload(
    *,
    delivery_id: uuid.UUID,
    event: str,
    input_request: InputRequest,
    policy: ApprovalPolicy,
    deadline: datetime.datetime | None = None,
    outcome: str | None = None,
) -> dict[str, Any]:
    """The JSON body. The message, the tool and the key come from an MCP server: cut short (JSON escapes them)."""
    task = input_request.task
    body = {
        "event": event,
        "delivery_id": str(delivery_id),
        "server": _cut(task.server.name, NAME_MAX_CHARS),
        "tool": _cut(task.tool, NAME_MAX_CHARS),
        "task_id": str(task.pk),
        "task_url": task_url(task.pk),
        "request_key": _cut(input_request.key, NAME_MAX_CHARS),
        "message": _cut((input_request.params or {}).get("message"), MESSAGE_MAX_CHARS),
        "deadline": deadline.isoformat() if deadline is not None else None,
        "policy_id": policy.pk,
    }
    if outcome is not None:
        body["outcome"] = _cut(outcome, 40)
    return body


def slack_escape(text: str) -> str:
    """Slack's mrkdwn takes &, < and > as control characters: escaped, a server's text links and mentions nothing."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


SLACK_HEADLINES = {
    WebhookEvent.REQUEST_WAITING: "A request waits for an answer",
    WebhookEvent.DEADLINE_NEAR: "A request's deadline is near",
    WebhookEvent.DEFAULT_APPLIED: "The deadline passed and taskhub applied the policy's default",
}


def slack_body(body: dict[str, Any]) -> dict[str, str]:
    """Slack's incoming-webhook form: {"text": …} with a `<url|text>` link; every server string escaped."""
    lines = [
        f"{SLACK_HEADLINES[body['event']]}: *{slack_escape(body['tool'])}* on *{slack_escape(body['server'])}*",
    ]
    if body["message"]:
        lines.append(f"server says: {slack_escape(body['message'])}")
    if body.get("outcome"):
        lines.append(f"taskhub: {slack_escape(body['outcome'])}")
    if body["deadline"]:
        lines.append(f"deadline: {body['deadline']}")
    lines.append(f"<{slack_escape(body['task_url'])}|Open the task>")
    return {"text": "\n".join(lines)}


def _queue(
    *,
    event: str,
    input_request: InputRequest,
    policy: ApprovalPolicy,
    deadline: datetime.datetime | None = None,
    outcome: str | None = None,
) -> list[WebhookDelivery]:
    deliveries = []
    deadline = deadline or input_request.answer_deadline_at
    for webhook in policy.webhooks.filter(enabled=True):
        delivery_id = uuid.uuid4()
        body = payload(
            delivery_id=delivery_id,
            event=event,
            input_request=input_request,
            policy=policy,
            deadline=deadline,
            outcome=outcome,
        )
        if webhook.format == WebhookFormat.SLACK:
            body = slack_body(body)
        delivery = WebhookDelivery.objects.create(
            id=delivery_id, webhook=webhook, event=event, input_request=input_request, body=body
        )
        hooks.enqueue_webhook_delivery(delivery.pk)
        deliveries.append(delivery)
    return deliveries


def _requests(ids: list[int]):
    return InputRequest.objects.select_related("task__server").filter(pk__in=ids)


@transaction.atomic
def queue_requests_waiting(*, input_request_ids: list[int]) -> list[WebhookDelivery]:
    """A request waits: each webhook of its policy (its tool's on its server, else its server's) is told."""
    if not PolicyWebhook.objects.filter(enabled=True).exists():  # the usual case: one cheap query, no more
        return []
    deliveries = []
    policies: dict[tuple[int, str], ApprovalPolicy | None] = {}
    for input_request in _requests(input_request_ids).filter(state=InputRequestState.OPEN).order_by("pk"):
        where = (input_request.server_id, input_request.task.tool)
        if where not in policies:
            policies[where] = effective_policy(*where)
        if policies[where] is not None:
            deliveries += _queue(
                event=WebhookEvent.REQUEST_WAITING, input_request=input_request, policy=policies[where]
            )
    return deliveries


@transaction.atomic
def queue_policy_event(
    *,
    event: str,
    input_request_id: int,
    policy_id: int,
    deadline: datetime.datetime | None = None,
    outcome: str | None = None,
) -> list[WebhookDelivery]:
    """A deadline event of the policy that set the deadline (approvals.signals): its webhooks are told."""
    input_request = _requests([input_request_id]).first()
    policy = ApprovalPolicy.objects.filter(pk=policy_id).first()
    if input_request is None or policy is None:
        return []
    return _queue(event=event, input_request=input_request, policy=policy, deadline=deadline, outcome=outcome)


def on_input_requests_opened(sender, *, task_id, input_request_ids, **kwargs) -> None:
    queue_requests_waiting(input_request_ids=list(input_request_ids))


def on_deadline_near(sender, *, input_request_id, policy_id, deadline, **kwargs) -> None:
    queue_policy_event(
        event=WebhookEvent.DEADLINE_NEAR, input_request_id=input_request_id, policy_id=policy_id, deadline=deadline
    )


def on_default_applied(sender, *, input_request_id, policy_id, outcome, **kwargs) -> None:
    queue_policy_event(
        event=WebhookEvent.DEFAULT_APPLIED, input_request_id=input_request_id, policy_id=policy_id, outcome=outcome
    )


# --- one attempt ---------------------------------------------------------------------------------------


def sign(*, secret: str, timestamp: str, body: bytes) -> str:
    """The X-Taskhub-Signature value: HMAC-SHA256 of `<timestamp>.<body>` with the secret, in hex."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def verify_signature(
    *,
    secret: str,
    timestamp: str,
    body: bytes,
    signature: str,
    tolerance_seconds: float = 300,
    now: float | None = None,
) -> bool:
    """The receiver's check: the signature matches, and the timestamp is recent (a replayed delivery is refused)."""
    try:
        age = abs((time.time() if now is None else now) - int(timestamp))
    except ValueError:
        return False
    return age <= tolerance_seconds and hmac.compare_digest(
        sign(secret=secret, timestamp=timestamp, body=body), signature
    )


@dataclass(frozen=True)
class Attempt:
    delivery_id: uuid.UUID
    url: str
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class Outcome:
    http_status: int | None  # None: no answer (timeout, connection error, refused address)
    excerpt: str  # the start of the answer, or what went wrong
    retryable: bool


def destination(*, delivery_id: uuid.UUID) -> str | None:
    """Where a delivery goes (scheme://host[:port]); None when it is gone. The job limits its sends per destination."""
    url = WebhookDelivery.objects.filter(pk=delivery_id).values_list("webhook__url", flat=True).first()
    return origin(url) if url is not None else None


@transaction.atomic
def start_attempt(*, delivery_id: uuid.UUID) -> Attempt | None:
    """Count the attempt and build the request; None when nothing is to be sent (delivered, given up, removed,
    or the webhook was turned off: then the delivery says so)."""
    delivery = (
        WebhookDelivery.objects.select_for_update(no_key=True, of=("self",))
        .select_related("webhook")
        .filter(pk=delivery_id)
        .first()
    )
    if delivery is None or delivery.status != DeliveryStatus.PENDING:
        return None
    webhook = delivery.webhook
    if not webhook.enabled:
        delivery.status = DeliveryStatus.CANCELLED
        delivery.next_try_at = None
        delivery.save(update_fields=["status", "next_try_at"])
        return None
    delivery.attempts += 1
    delivery.last_attempt_at = timezone.now()
    delivery.save(update_fields=["attempts", "last_attempt_at"])
    body = json.dumps(delivery.body, ensure_ascii=False, separators=(",", ":")).encode()
    timestamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "taskhub-webhooks",
        "X-Taskhub-Event": delivery.event,
        "X-Taskhub-Delivery": str(delivery.pk),
        "X-Taskhub-Timestamp": timestamp,
    }
    if webhook.secret:
        headers["X-Taskhub-Signature"] = sign(secret=webhook.secret, timestamp=timestamp, body=body)
    return Attempt(delivery_id=delivery.pk, url=sent_to(webhook), headers=headers, body=body)


async def post(attempt: Attempt, *, timeout: float | None = None) -> Outcome:
    """POST once. Never raises for what the receiver does: a hang ends at the timeout, a huge answer is read
    RESPONSE_MAX_BYTES far, redirects are not followed, and each connection goes to an address the policy allows."""
    timeout = settings.TASKHUB_WEBHOOK_TIMEOUT_SECONDS if timeout is None else timeout
    try:
        async with asyncio.timeout(timeout):
            async with (
                Outbound(server_address_policy()).httpx_client(
                    timeout=httpx2.Timeout(timeout), follow_redirects=False
                ) as client,
                client.stream("POST", attempt.url, content=attempt.body, headers=attempt.headers) as answer,
            ):
                start = b""
                async for chunk in answer.aiter_raw():
                    start += chunk
                    if len(start) >= RESPONSE_MAX_BYTES:
                        break
                status = answer.status_code
    except TimeoutError:
        return Outcome(None, f"no answer within {timeout:g} s", retryable=True)
    except AddressRefused as refused:
        return Outcome(None, str(refused), retryable=False)
    except Exception as error:  # connection refused or reset, TLS, DNS, a broken answer…: the receiver's trouble
        return Outcome(None, f"{type(error).__name__}: {error}" if str(error) else type(error).__name__, retryable=True)
    excerpt = start[:RESPONSE_MAX_BYTES].decode("utf-8", "replace")
    return Outcome(status, excerpt, retryable=status >= 500 or status in (408, 429))


def next_try_at(attempts: int) -> datetime.datetime:
    """When to try again after `attempts` failed: TASKHUB_WEBHOOK_RETRY_SECONDS, doubling, with jitter."""
    wait = backoff.exponential(attempts - 1, first=settings.TASKHUB_WEBHOOK_RETRY_SECONDS, cap=RETRY_CAP_SECONDS)
    return timezone.now() + datetime.timedelta(seconds=wait * random.uniform(0.8, 1.2))


@transaction.atomic
def record_attempt(*, delivery_id: uuid.UUID, outcome: Outcome) -> WebhookDelivery | None:
    """What the attempt means for the delivery: delivered, tried again at `next_try_at`, or given up (audited)."""
    delivery = (
        WebhookDelivery.objects.select_for_update(no_key=True, of=("self",))
        .select_related("webhook__policy__server", "input_request__task")
        .filter(pk=delivery_id)
        .first()
    )
    if delivery is None or delivery.status != DeliveryStatus.PENDING:
        return delivery
    delivery.last_http_status = outcome.http_status
    delivery.last_error = "" if _delivered(outcome) else _cut(outcome.excerpt, ERROR_MAX_CHARS)
    if _delivered(outcome):
        delivery.status = DeliveryStatus.DELIVERED
        delivery.delivered_at = timezone.now()
        delivery.next_try_at = None
    elif outcome.retryable and delivery.attempts < settings.TASKHUB_WEBHOOK_ATTEMPTS:
        delivery.next_try_at = next_try_at(delivery.attempts)
    else:
        delivery.status = DeliveryStatus.FAILED
        delivery.next_try_at = None
        task = delivery.input_request.task if delivery.input_request is not None else None
        record_event(
            action="approval_webhook.delivery_failed",
            actor_label=WORKER,
            task=task,
            server=delivery.webhook.policy.server,
            data={
                "webhook": delivery.webhook_id,
                "to": origin(delivery.webhook.url),
                "event": delivery.event,
                "delivery": str(delivery.pk),
                "attempts": delivery.attempts,
                "http_status": outcome.http_status,
                "error": delivery.last_error,
            },
        )
    delivery.save()
    return delivery


def _delivered(outcome: Outcome) -> bool:
    return outcome.http_status is not None and 200 <= outcome.http_status < 300


def job_attempts() -> int:
    return settings.TASKHUB_WEBHOOK_ATTEMPTS + JOB_ATTEMPTS_SLACK


def recent_deliveries(policy: ApprovalPolicy, *, limit: int = 20):
    return (
        WebhookDelivery.objects.filter(webhook__policy=policy).select_related("webhook").order_by("-created_at")[:limit]
    )


def purge_old_deliveries(*, created_before: datetime.datetime) -> int:
    """Retention (the worker's hourly sweep, TASKHUB_RETENTION_DAYS): the delivery log's finished rows go with the
    tasks they told about; one still being tried stays."""
    deleted, _ = (
        WebhookDelivery.objects.filter(created_at__lt=created_before).exclude(status=DeliveryStatus.PENDING).delete()
    )
    return deleted
