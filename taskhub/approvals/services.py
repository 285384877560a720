"""Every change to an approval policy: one transaction writing the policy and its audit row."""

from collections.abc import Iterable
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.translation import gettext

from taskhub.approvals.models import ApprovalPolicy
from taskhub.approvals.webhooks import describe_webhook
from taskhub.audit.services import record_event


class PolicyInvalid(Exception):
    """The policy cannot be saved as asked; the message is meant for the admin."""


# What update_policy changes besides who answers.
TERMS = (
    "tool",
    "required_accepts",
    "allow_self_approval",
    "comment_required_on_decline",
    "gate_before_call",
    "answer_within",
    "at_deadline",
    "deadline_answer",
    "escalation_group",
    "input_from",
)


def describe_policy(policy: ApprovalPolicy) -> dict[str, Any]:
    """What a policy says, as its audit rows and the API show it."""
    return {
        "server": policy.server.name,
        "tool": policy.tool,
        "groups": sorted(group.name for group in policy.groups.all()),
        "users": sorted(user.get_username() for user in policy.users.all()),
        "required_accepts": policy.required_accepts,
        "allow_self_approval": policy.allow_self_approval,
        "comment_required_on_decline": policy.comment_required_on_decline,
        "gate_before_call": policy.gate_before_call,
        "answer_within_seconds": (
            int(policy.answer_within.total_seconds()) if policy.answer_within is not None else None
        ),
        "at_deadline": policy.at_deadline,
        "deadline_answer": policy.deadline_answer,
        "escalation_group": policy.escalation_group.name if policy.escalation_group else None,
        "input_from": policy.input_from,
    }


def _save(policy: ApprovalPolicy) -> None:
    try:
        policy.full_clean(validate_unique=True, validate_constraints=False)
    except ValidationError as invalid:
        raise PolicyInvalid(" ".join(invalid.messages)) from invalid
    if ApprovalPolicy.objects.filter(server=policy.server, tool=policy.tool).exclude(pk=policy.pk).exists():
        said = (
            gettext("%(server)s has a policy for the tool %(tool)s already; edit that one.")
            if policy.tool
            else gettext("%(server)s has a policy for every tool already; edit that one.")
        )
        raise PolicyInvalid(said % {"server": policy.server.name, "tool": repr(policy.tool)})
    policy.save()


@transaction.atomic
def create_policy(
    *, server, tool: str = "", groups: Iterable = (), users: Iterable = (), user, token=None, **terms: Any
) -> ApprovalPolicy:
    """`token`: the API token (an agent) it came through, named in the audit row (as in every service)."""
    policy = ApprovalPolicy(server=server, tool=(tool or "").strip(), **terms)
    _save(policy)
    policy.groups.set(list(groups))
    policy.users.set(list(users))
    record_event(
        action="approval_policy.created",
        user=user,
        server=server,
        data={"id": policy.pk, **describe_policy(policy)},
        token=token,
    )
    return policy


@transaction.atomic
def update_policy(
    *,
    policy: ApprovalPolicy,
    user,
    groups: Iterable | None = None,
    users: Iterable | None = None,
    token=None,
    **terms: Any,
) -> ApprovalPolicy:
    policy = ApprovalPolicy.objects.select_for_update(no_key=True).select_related("server").get(pk=policy.pk)
    before = describe_policy(policy)
    for name, value in terms.items():
        if name not in TERMS:
            raise TypeError(f"update_policy cannot change {name}")
        setattr(policy, name, (value or "").strip() if name == "tool" else value)
    _save(policy)
    if groups is not None:
        policy.groups.set(list(groups))
    if users is not None:
        policy.users.set(list(users))
    after = describe_policy(policy)
    changed = {name: value for name, value in after.items() if before[name] != value}
    if changed:
        record_event(
            action="approval_policy.updated",
            user=user,
            server=policy.server,
            data={"id": policy.pk, "server": policy.server.name, "tool": policy.tool, "changed": changed},
            token=token,
        )
    return policy


@transaction.atomic
def remove_policy(*, policy: ApprovalPolicy, user, token=None) -> None:
    policy = ApprovalPolicy.objects.select_for_update(no_key=True).select_related("server").get(pk=policy.pk)
    data = {"id": policy.pk, **describe_policy(policy)}
    if webhooks := [describe_webhook(webhook) for webhook in policy.webhooks.all()]:
        data["webhooks_removed"] = webhooks  # they go with the policy (and their delivery log)
    record_event(action="approval_policy.removed", user=user, server=policy.server, data=data, token=token)
    policy.delete()
