"""/api/approval-policies: the admins' approval policies over HTTP (as their page and `manage.py approval_policy`),
and each policy's webhooks with their recent deliveries."""

import datetime
from typing import Literal

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied
from django.http import Http404
from ninja import Field, Schema
from ninja.responses import Status

from taskhub.accounts import permissions
from taskhub.api.endpoints import ApiProblem, api
from taskhub.api.schemas import Problem
from taskhub.approvals import services, webhooks
from taskhub.approvals.models import MAX_ANSWER_WITHIN, MIN_ANSWER_WITHIN, ApprovalPolicy, AtDeadline, PolicyWebhook
from taskhub.approvals.rules import answerer_names
from taskhub.servers.models import Server


class PolicyIn(Schema):
    server: str = Field(description="the server's name")
    tool: str = Field("", description="empty: every tool of the server without a policy of its own")
    groups: list[str] = Field(default_factory=list, description="names of groups whose approvers answer")
    users: list[str] = Field(default_factory=list, description="usernames of approvers who answer")
    required_accepts: int = Field(1, description="different people who must accept before the answer is sent")
    allow_self_approval: bool = False
    comment_required_on_decline: bool = False
    gate_before_call: bool = Field(False, description="needs approval before it runs (tools/call waits for it)")
    answer_within_seconds: int | None = Field(
        None, description="the answer deadline, counted from when each request opens; null: none"
    )
    at_deadline: str = Field("decline", description="decline | cancel | answer | escalate")
    deadline_answer: dict | None = Field(None, description='the fixed answer for "answer": an ElicitResult')
    escalation_group: str | None = Field(None, description='the name of the group that answers after "escalate"')
    input_from: Literal["people", "agent"] = Field(
        "people", description="for calls through the gateway: who answers the server's requests"
    )


class PolicyOut(PolicyIn):
    id: int
    answered_by: str = Field(description='who answers, as cards say it ("for: …")')


def _admin(request) -> None:
    if not permissions.is_admin(request.user):
        raise PermissionDenied("Approval policies are for admins.")


def _out(policy: ApprovalPolicy) -> dict:
    return {"id": policy.pk, **services.describe_policy(policy), "answered_by": answerer_names(policy)}


def _named(model, field: str, names: list[str], what: str) -> list:
    found = list(model.objects.filter(**{f"{field}__in": names}))
    missing = set(names) - {getattr(row, field) for row in found}
    if missing:
        raise ApiProblem(
            400, f"No such {what}: {', '.join(sorted(missing))}.", {what + "s": ", ".join(sorted(missing))}
        )
    return found


def _policy(policy_id: int) -> ApprovalPolicy:
    policy = ApprovalPolicy.objects.select_related("server").filter(pk=policy_id).first()
    if policy is None:
        raise Http404("No such approval policy.")
    return policy


TERMS = {
    "tool",
    "required_accepts",
    "allow_self_approval",
    "comment_required_on_decline",
    "gate_before_call",
    "input_from",
}


def _deadline_terms(payload: PolicyIn) -> dict:
    """The deadline's fields as the services take them (a duration, a Group)."""
    if payload.at_deadline not in AtDeadline.values:
        raise ApiProblem(400, f"at_deadline must be one of {', '.join(AtDeadline.values)}.", {"at_deadline": "unknown"})
    seconds = payload.answer_within_seconds
    if seconds is not None and not MIN_ANSWER_WITHIN.total_seconds() <= seconds <= MAX_ANSWER_WITHIN.total_seconds():
        raise ApiProblem(
            400, "The answer deadline must be between 1 second and 30 days.", {"answer_within_seconds": "out of range"}
        )
    group = None
    if payload.escalation_group:
        group = _named(Group, "name", [payload.escalation_group], "group")[0]
    return {
        "answer_within": datetime.timedelta(seconds=seconds) if seconds is not None else None,
        "at_deadline": payload.at_deadline,
        "deadline_answer": payload.deadline_answer,
        "escalation_group": group,
    }


POLICIES = ApprovalPolicy.objects.select_related("server", "escalation_group").prefetch_related("groups", "users")


@api.get("/approval-policies", response={200: list[PolicyOut], 401: Problem, 403: Problem}, tags=["approvals"])
def list_policies(request):
    """Every approval policy: who answers a server's (or a tool's) requests, and on what terms."""
    _admin(request)
    return [_out(policy) for policy in POLICIES.all()]


@api.post("/approval-policies", response={201: PolicyOut, 400: Problem, 401: Problem, 403: Problem}, tags=["approvals"])
def create_policy(request, payload: PolicyIn):
    """A new policy for a server, or for one of its tools (which replaces the server's for that tool)."""
    _admin(request)
    server = Server.objects.filter(name=payload.server, removed_at__isnull=True).first()
    if server is None:
        raise ApiProblem(400, f"No server named {payload.server!r}.", {"server": "unknown"})
    try:
        policy = services.create_policy(
            server=server,
            tool=payload.tool,
            groups=_named(Group, "name", payload.groups, "group"),
            users=_named(get_user_model(), "username", payload.users, "user"),
            user=request.user,
            token=request.api_token,
            **payload.dict(include=TERMS - {"tool"}),
            **_deadline_terms(payload),
        )
    except services.PolicyInvalid as invalid:
        raise ApiProblem(400, str(invalid)) from invalid
    return Status(201, _out(POLICIES.get(pk=policy.pk)))


@api.put(
    "/approval-policies/{policy_id}",
    response={200: PolicyOut, 400: Problem, 401: Problem, 403: Problem, 404: Problem},
    tags=["approvals"],
)
def update_policy(request, policy_id: int, payload: PolicyIn):
    """Replace a policy's terms (its server stays)."""
    _admin(request)
    policy = _policy(policy_id)
    if payload.server != policy.server.name:
        raise ApiProblem(400, "A policy stays with its server; create one for the other server.", {"server": "fixed"})
    try:
        services.update_policy(
            policy=policy,
            groups=_named(Group, "name", payload.groups, "group"),
            users=_named(get_user_model(), "username", payload.users, "user"),
            user=request.user,
            token=request.api_token,
            **payload.dict(include=TERMS),
            **_deadline_terms(payload),
        )
    except services.PolicyInvalid as invalid:
        raise ApiProblem(400, str(invalid)) from invalid
    return _out(POLICIES.get(pk=policy.pk))


@api.delete(
    "/approval-policies/{policy_id}", response={204: None, 401: Problem, 403: Problem, 404: Problem}, tags=["approvals"]
)
def delete_policy(request, policy_id: int):
    """Remove a policy: every approver answers there again (or the server's policy, for a tool's)."""
    _admin(request)
    services.remove_policy(policy=_policy(policy_id), user=request.user, token=request.api_token)
    return Status(204, None)


# --- a policy's webhooks ---------------------------------------------------------------------------------


class WebhookIn(Schema):
    url: str = Field(description="http(s) address taskhub POSTs to; checked like MCP servers' addresses")
    secret: str | None = Field(
        None, description="signs each delivery (X-Taskhub-Signature); write-only. On PUT, null keeps the stored one"
    )
    format: Literal["json", "slack"] = Field("json", description='signed JSON, or Slack\'s {"text": …}')
    enabled: bool = True


class WebhookOut(Schema):
    id: int
    policy_id: int
    url: str
    format: str
    enabled: bool
    secret_set: bool = Field(description="the secret is never shown again, only whether one is set")


class DeliveryOut(Schema):
    id: str = Field(description="the X-Taskhub-Delivery header")
    webhook_id: int
    event: str
    status: Literal["pending", "delivered", "failed", "cancelled"]
    attempts: int
    last_http_status: int | None
    last_error: str = Field(description="the start of the receiver's answer, or what went wrong (untrusted)")
    next_try_at: datetime.datetime | None
    delivered_at: datetime.datetime | None
    created_at: datetime.datetime


def _webhook_out(webhook: PolicyWebhook) -> dict:
    return {
        "id": webhook.pk,
        "policy_id": webhook.policy_id,
        "url": webhook.url,
        "format": webhook.format,
        "enabled": webhook.enabled,
        "secret_set": bool(webhook.secret),
    }


def _webhook(policy_id: int, webhook_id: int) -> PolicyWebhook:
    webhook = PolicyWebhook.objects.filter(pk=webhook_id, policy_id=policy_id).first()
    if webhook is None:
        raise Http404("No such webhook of this policy.")
    return webhook


@api.get(
    "/approval-policies/{policy_id}/webhooks",
    response={200: list[WebhookOut], 401: Problem, 403: Problem, 404: Problem},
    tags=["approvals"],
)
def list_webhooks(request, policy_id: int):
    """The webhooks of a policy (secrets never shown)."""
    _admin(request)
    return [_webhook_out(webhook) for webhook in _policy(policy_id).webhooks.all()]


@api.post(
    "/approval-policies/{policy_id}/webhooks",
    response={201: WebhookOut, 400: Problem, 401: Problem, 403: Problem, 404: Problem},
    tags=["approvals"],
)
def create_webhook(request, policy_id: int, payload: WebhookIn):
    """A new webhook: taskhub POSTs to it when a request under the policy waits, its deadline nears, or a default
    is applied."""
    _admin(request)
    policy = _policy(policy_id)
    try:
        webhook = webhooks.create_webhook(
            policy=policy,
            url=payload.url,
            secret=payload.secret or "",
            format=payload.format,
            enabled=payload.enabled,
            user=request.user,
        )
    except webhooks.WebhookInvalid as invalid:
        raise ApiProblem(400, str(invalid)) from invalid
    return Status(201, _webhook_out(webhook))


@api.put(
    "/approval-policies/{policy_id}/webhooks/{webhook_id}",
    response={200: WebhookOut, 400: Problem, 401: Problem, 403: Problem, 404: Problem},
    tags=["approvals"],
)
def update_webhook(request, policy_id: int, webhook_id: int, payload: WebhookIn):
    """Replace a webhook's URL, format and switch; its secret too when one is given."""
    _admin(request)
    try:
        webhook = webhooks.update_webhook(
            webhook=_webhook(policy_id, webhook_id),
            url=payload.url,
            secret=payload.secret,
            format=payload.format,
            enabled=payload.enabled,
            user=request.user,
        )
    except webhooks.WebhookInvalid as invalid:
        raise ApiProblem(400, str(invalid)) from invalid
    return _webhook_out(webhook)


@api.delete(
    "/approval-policies/{policy_id}/webhooks/{webhook_id}",
    response={204: None, 401: Problem, 403: Problem, 404: Problem},
    tags=["approvals"],
)
def delete_webhook(request, policy_id: int, webhook_id: int):
    """Remove a webhook, with its delivery log."""
    _admin(request)
    webhooks.remove_webhook(webhook=_webhook(policy_id, webhook_id), user=request.user)
    return Status(204, None)


@api.get(
    "/approval-policies/{policy_id}/webhook-deliveries",
    response={200: list[DeliveryOut], 401: Problem, 403: Problem, 404: Problem},
    tags=["approvals"],
)
def list_webhook_deliveries(request, policy_id: int):
    """The policy's latest deliveries, newest first: how each went."""
    _admin(request)
    return [
        {
            "id": str(delivery.pk),
            "webhook_id": delivery.webhook_id,
            "event": delivery.event,
            "status": delivery.status,
            "attempts": delivery.attempts,
            "last_http_status": delivery.last_http_status,
            "last_error": delivery.last_error,
            "next_try_at": delivery.next_try_at,
            "delivered_at": delivery.delivered_at,
            "created_at": delivery.created_at,
        }
        for delivery in webhooks.recent_deliveries(_policy(policy_id), limit=100)
    ]
