"""The approval policies as the rest of taskhub asks about them (registered in accounts.permissions at startup).

A request's policy is its tool's on its server, else its server's (tool empty), else none: every approver answers,
one acceptance suffices, self-approval is allowed. Policies are few (an admin writes each), so each question reads
them all in one or two small queries and builds its filter in Python.
"""

from collections import defaultdict
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.postgres.expressions import ArraySubquery
from django.db.models import Count, Exists, OuterRef, Q, QuerySet, Subquery

from taskhub.accounts.permissions import AnswerTerms
from taskhub.approvals.models import ApprovalPolicy, AtDeadline, say_duration
from taskhub.servers.models import Server
from taskhub.tasks.models import InputRequest, InputRequestState

NOTHING = Q(pk__in=[])
# What AnswerTerms needs of a policy (and its __str__, of its server).
TERMS_FIELDS = (
    "tool",
    "required_accepts",
    "allow_self_approval",
    "comment_required_on_decline",
    "gate_before_call",
    "answer_within",
    "input_from",
    "server__name",
)


@dataclass(frozen=True)
class _Row:
    pk: int
    server_id: int
    tool: str
    open: bool  # names no group and no user: every approver


def _rows() -> list[_Row]:
    rows = ApprovalPolicy.objects.annotate(
        n_groups=Count("groups", distinct=True), n_users=Count("users", distinct=True)
    ).values_list("pk", "server_id", "tool", "n_groups", "n_users")
    return [_Row(pk, server_id, tool, not (n_groups or n_users)) for pk, server_id, tool, n_groups, n_users in rows]


def _naming(user) -> set[int]:
    """The policies that name this user, or a group of theirs."""
    return set(
        ApprovalPolicy.objects.filter(Q(users=user) | Q(groups__user=user)).values_list("pk", flat=True).distinct()
    )


def effective_policy(server_id: int, tool: str) -> ApprovalPolicy | None:
    policies = {p.tool: p for p in ApprovalPolicy.objects.filter(server_id=server_id, tool__in=["", tool or ""])}
    return policies.get(tool or "") or policies.get("")


def answerer_names(policy: ApprovalPolicy) -> str:
    """ "finance, olga": the groups, then the named users; "all approvers" when it names none."""
    names = sorted(group.name for group in policy.groups.all()) + sorted(
        user.get_username() for user in policy.users.all()
    )
    return ", ".join(names) if names else "all approvers"


def deadline_words(policy: ApprovalPolicy) -> str:
    """ "within 30 min, then decline the request": the policy's deadline as its page and command say it."""
    if policy.answer_within is None:
        return "no deadline"
    then = policy.get_at_deadline_display()
    if policy.at_deadline == AtDeadline.ESCALATE:
        then = f"escalate to {policy.escalation_group.name if policy.escalation_group else '(a removed group)'}"
    return f"within {say_duration(policy.answer_within)}, then {then}"


def _group_ids(user) -> list[int]:
    return list(user.groups.values_list("pk", flat=True))


def _escalated_to_groups_of(user) -> QuerySet[InputRequest]:
    return InputRequest.objects.filter(state=InputRequestState.OPEN, escalated_to__in=_group_ids(user))


class PolicyRules:
    def _allowed(self, user) -> tuple[list[_Row], dict[int, bool]]:
        rows = _rows()
        naming = _naming(user) if rows else set()
        return rows, {row.pk: row.open or row.pk in naming for row in rows}

    def _refused(self, user) -> tuple[Q | None, set[int]]:
        """The requests this user may not answer (None: none), and the servers where they may answer nothing."""
        rows, allowed = self._allowed(user)
        tools_allowed: dict[int, list[str]] = defaultdict(list)
        refused: Q | None = None
        for row in rows:
            if row.tool:
                if allowed[row.pk]:
                    tools_allowed[row.server_id].append(row.tool)
                else:
                    refused = (refused or NOTHING) | Q(server_id=row.server_id, task__tool=row.tool)
        closed_servers = set()
        for row in rows:
            if not row.tool and not allowed[row.pk]:
                here = Q(server_id=row.server_id) & ~Q(task__tool__in=tools_allowed[row.server_id])
                refused = (refused or NOTHING) | here
                if not tools_allowed[row.server_id]:
                    closed_servers.add(row.server_id)
        return refused, closed_servers

    def servers(self, user) -> QuerySet[Server]:
        _, closed = self._refused(user)
        escalated_here = _escalated_to_groups_of(user).values("server_id")
        return Server.objects.exclude(Q(pk__in=closed) & ~Q(pk__in=escalated_here))

    def requests(self, user) -> Q:
        """A request escalated at its deadline is answered by its escalation group, whatever its policy says."""
        refused, _ = self._refused(user)
        by_policy = Q(escalated_to__isnull=True) if refused is None else Q(escalated_to__isnull=True) & ~refused
        return by_policy | Q(escalated_to__in=_group_ids(user))

    def for_me(self, user) -> Q:
        rows = _rows()
        naming = _naming(user) if rows else set()
        tools_with_policy: dict[int, list[str]] = defaultdict(list)
        for row in rows:
            if row.tool:
                tools_with_policy[row.server_id].append(row.tool)
        mine = NOTHING
        for row in rows:
            if row.pk not in naming:
                continue
            if row.tool:
                mine |= Q(server_id=row.server_id, task__tool=row.tool)
            else:
                mine |= Q(server_id=row.server_id) & ~Q(task__tool__in=tools_with_policy[row.server_id])
        return (mine & Q(escalated_to__isnull=True)) | Q(escalated_to__in=_group_ids(user))

    def terms(self, server_id: int, tool: str) -> AnswerTerms:
        return _terms(self._effective_with_names(server_id, tool))

    def terms_and_allows(self, user, server_id: int, tool: str) -> tuple[AnswerTerms, bool]:
        """terms() and allows() in one query: the answer view asks both on the approver's click."""
        policy = self._effective_with_names(server_id, tool, user=user)
        if policy is None:
            return AnswerTerms(), True
        names_anyone = policy.group_names or policy.user_names
        return _terms(policy), not names_anyone or policy.names_user or policy.names_group_of_user

    def _effective_with_names(self, server_id: int, tool: str, *, user=None) -> ApprovalPolicy | None:
        # One query (an answer reads it on the approver's click): the policy's terms, its server's name and the names
        # of the groups and users it lists, as `answerers` says them; with `user`, whether it names them or a group of
        # theirs. Only the columns the terms need: a whole server row is its catalogue and four encrypted fields.
        user_model = get_user_model()
        policies = (
            ApprovalPolicy.objects.filter(server_id=server_id, tool__in=["", tool or ""])
            .select_related("server")
            .only(*TERMS_FIELDS)
            .order_by()
            .annotate(
                group_names=ArraySubquery(Group.objects.filter(approval_policies=OuterRef("pk")).values("name")),
                user_names=ArraySubquery(
                    user_model.objects.filter(approval_policies=OuterRef("pk")).values(user_model.USERNAME_FIELD)
                ),
            )
        )
        if user is not None:
            users, groups = ApprovalPolicy.users.through.objects, ApprovalPolicy.groups.through.objects
            policies = policies.annotate(
                names_user=Exists(users.filter(approvalpolicy=OuterRef("pk"), user=user.pk)),
                names_group_of_user=Exists(groups.filter(approvalpolicy=OuterRef("pk"), group__user=user.pk)),
            )
        by_tool = {policy.tool: policy for policy in policies}
        return by_tool.get(tool or "") or by_tool.get("")

    def answerers(self, server_id: int, tool: str) -> Q:
        # No query of its own: the effective policy (the tool's, else the server's, as effective_policy) is a
        # subquery, so that the permission check asks one query on an approver's click and the mails one per request.
        here = ApprovalPolicy.objects.filter(server_id=server_id, tool__in=["", tool or ""])
        effective = Subquery(here.order_by("-tool").values("pk")[:1])  # a tool's policy sorts before the server's
        named_users = ApprovalPolicy.users.through.objects.filter(approvalpolicy=effective)
        named_groups = ApprovalPolicy.groups.through.objects.filter(approvalpolicy=effective)
        members = get_user_model().groups.through.objects.filter(group__in=named_groups.values("group_id"))
        return (
            ~Exists(here)
            | (~Exists(named_users) & ~Exists(named_groups))
            | Q(pk__in=named_users.values("user_id"))
            | Q(pk__in=members.values("user_id"))
        )


def _terms(policy: ApprovalPolicy | None) -> AnswerTerms:
    if policy is None:
        return AnswerTerms()
    names = sorted(policy.group_names) + sorted(policy.user_names)
    return AnswerTerms(
        policy_id=policy.pk,
        policy=f"the approval policy of {policy}",
        answerers=", ".join(names) if names else "all approvers",
        required_accepts=policy.required_accepts,
        self_approval=policy.allow_self_approval,
        comment_on_decline=policy.comment_required_on_decline,
        gate_before_call=policy.gate_before_call,
        answer_within=policy.answer_within,
        input_from=policy.input_from,
    )
