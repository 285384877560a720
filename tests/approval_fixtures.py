"""Who answers a server's requests, set in tests the way the approver groups were: a server-wide approval policy
that keeps self-approval allowed (as the migration of the groups does)."""

from taskhub.approvals.models import ApprovalPolicy


def set_approver_groups(server, groups) -> ApprovalPolicy:
    policy, _ = ApprovalPolicy.objects.get_or_create(server=server, tool="", defaults={"allow_self_approval": True})
    policy.groups.set(list(groups))
    return policy


def add_approver_groups(server, *groups) -> ApprovalPolicy:
    policy, _ = ApprovalPolicy.objects.get_or_create(server=server, tool="", defaults={"allow_self_approval": True})
    policy.groups.add(*groups)
    return policy
