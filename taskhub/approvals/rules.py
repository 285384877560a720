"""The approval policies as the rest of taskhub asks about them (registered in accounts.permissions at startup).

A request's policy is its tool's on its server, else its server's (tool empty), else none: every approver answers,
one acceptance suffices, self-approval is allowed. Policies are few (an admin writes each), so each question reads
them all in one or two small queries and builds its filter in Python.
"""

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from functools import cache

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connection
from django.db.models import Exists, Q, QuerySet, Subquery
from django.utils.translation import gettext

from taskhub.accounts.permissions import (
    AcceptanceCount,
    AnswerDeadline,
    AnswerTerms,
    group_ids_of,
    read_once_per_request,
)
from taskhub.approvals import answer_rules
from taskhub.approvals.models import ApprovalPolicy, AtDeadline
from taskhub.database.prepared import prepared_cursor
from taskhub.servers.models import Server
from taskhub.tasks.durations import duration_text
from taskhub.tasks.models import InputRequest, InputRequestState

NOTHING = Q(pk__in=[])


@dataclass(frozen=True)
class _Row:
    pk: int
    server_id: int
    tool: str
    open: bool  # names no group and no user: every approver


def _policies_for(user) -> tuple[list[_Row], dict[int, bool]]:
    """Every policy, and whether each lets this user answer (it names nobody, or them or a group of theirs), in one
    statement prepared on the server: every page reads it (the nav's access), and the ORM's two queries (a count of
    each policy's groups and users, then those naming the user) took 0.7 ms of Python on each, against 0.03."""
    with prepared_cursor() as cursor:
        cursor.execute(_policies_sql(), {"user": user.pk})
        fetched = cursor.fetchall()
    rows = [_Row(pk, server_id, tool, is_open) for pk, server_id, tool, is_open, _ in fetched]
    return rows, {pk: is_open or names_user for pk, _, _, is_open, names_user in fetched}


@cache
def _policies_sql() -> str:
    policy_users = ApprovalPolicy.users.through._meta.db_table
    policy_groups = ApprovalPolicy.groups.through._meta.db_table
    names_user, names_group_of_user = _names_user_sql()
    return f"""
        SELECT p.id, p.server_id, p.tool,
               NOT EXISTS (SELECT 1 FROM "{policy_groups}" pg WHERE pg.approvalpolicy_id = p.id)
                 AND NOT EXISTS (SELECT 1 FROM "{policy_users}" pu WHERE pu.approvalpolicy_id = p.id),
               {names_user} OR {names_group_of_user}
        FROM "{ApprovalPolicy._meta.db_table}" p
    """


def _names_user_sql() -> tuple[str, str]:
    """Whether the policy `p` names the user %(user)s, and whether it names a group of theirs: two SQL expressions,
    for the statements that ask (_policies_sql, _effective_policy_sql)."""
    policy_users = ApprovalPolicy.users.through._meta.db_table
    policy_groups = ApprovalPolicy.groups.through._meta.db_table
    user_groups = get_user_model().groups.through._meta.db_table
    return (
        f'EXISTS(SELECT 1 FROM "{policy_users}" pu WHERE pu.approvalpolicy_id = p.id AND pu.user_id = %(user)s)',
        f'EXISTS(SELECT 1 FROM "{policy_groups}" pg JOIN "{user_groups}" ug ON ug.group_id = pg.group_id '
        "WHERE pg.approvalpolicy_id = p.id AND ug.user_id = %(user)s)",
    )


def effective_policy(server_id: int, tool: str) -> ApprovalPolicy | None:
    policies = {p.tool: p for p in ApprovalPolicy.objects.filter(server_id=server_id, tool__in=["", tool or ""])}
    return policies.get(tool or "") or policies.get("")


def answerer_names(policy: ApprovalPolicy, *, none_named: str = "all approvers") -> str:
    """ "finance, olga": the groups, then the named users; `none_named` when it names none (the API's English
    by default; a page passes it in the reader's language)."""
    names = sorted(group.name for group in policy.groups.all()) + sorted(
        user.get_username() for user in policy.users.all()
    )
    return ", ".join(names) if names else none_named


def deadline_words(policy: ApprovalPolicy) -> str:
    """ "within 30 min, then decline the request": the policy's deadline as its page and command say it (in the
    language active: a command's is English)."""
    if policy.answer_within is None:
        return gettext("no deadline")
    then = policy.get_at_deadline_display()
    if policy.at_deadline == AtDeadline.ESCALATE:
        group = policy.escalation_group.name if policy.escalation_group else gettext("(a removed group)")
        then = gettext("escalate to %(group)s") % {"group": group}
    return gettext("within %(duration)s, then %(then)s") % {
        "duration": duration_text(policy.answer_within.total_seconds()),
        "then": then,
    }


def _escalated_to_groups_of(user) -> QuerySet[InputRequest]:
    return InputRequest.objects.filter(state=InputRequestState.OPEN, escalated_to__in=group_ids_of(user))


class PolicyRules:
    def _allowed(self, user) -> tuple[list[_Row], dict[int, bool]]:
        """Every policy, and whether each lets this user answer: it names nobody, or them or a group of theirs."""
        return read_once_per_request("policies", user, lambda: _policies_for(user))

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
        if not closed:  # no server refuses them everything: all of them, without reading their groups
            return Server.objects.all()
        escalated_here = _escalated_to_groups_of(user).values("server_id")
        return Server.objects.exclude(Q(pk__in=closed) & ~Q(pk__in=escalated_here))

    def servers_refusing_some(self, user) -> set[int]:
        """The servers where a policy (the server's or a tool's) refuses this user some requests; on the others, the
        rules refuse them nothing (but a request escalated at its deadline)."""
        rows, allowed = self._allowed(user)
        return {row.server_id for row in rows if not allowed[row.pk]}

    def requests(self, user) -> Q:
        """A request escalated at its deadline is answered by its escalation group, whatever its policy says."""
        refused, _ = self._refused(user)
        by_policy = Q(escalated_to__isnull=True) if refused is None else Q(escalated_to__isnull=True) & ~refused
        return by_policy | Q(escalated_to__in=group_ids_of(user))

    def for_me(self, user) -> Q:
        rows, allowed = self._allowed(user)
        naming = {row.pk for row in rows if allowed[row.pk] and not row.open}
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
        return (mine & Q(escalated_to__isnull=True)) | Q(escalated_to__in=group_ids_of(user))

    def terms(self, server_id: int, tool: str) -> AnswerTerms:
        policy = _effective_with_names(server_id, tool, user_id=None)
        return _terms(policy) if policy is not None else AnswerTerms()

    def terms_and_allows(self, user, server_id: int, tool: str) -> tuple[AnswerTerms, bool]:
        """terms() and allows() in one query: the answer view asks both on the approver's click."""
        return _terms_and_allows(_effective_with_names(server_id, tool, user_id=user.pk))

    def terms_and_allows_of(
        self, user, pairs: Iterable[tuple[int, str]]
    ) -> dict[tuple[int, str], tuple[AnswerTerms, bool]]:
        return {pair: _terms_and_allows(policy) for pair, policy in _effective_of(pairs, user_id=user.pk).items()}

    # The rules of one answer and one request's deadline (answer_rules).
    def answer_refusal(self, *, input_request, answer, user, terms: AnswerTerms, comment: str) -> str:
        return answer_rules.answer_refusal(
            input_request=input_request, answer=answer, user=user, terms=terms, comment=comment
        )

    def launcher_barred(self, *, input_request, user, terms: AnswerTerms) -> bool:
        return answer_rules.launcher_barred(input_request=input_request, user=user, terms=terms)

    def count_acceptance(self, *, input_request, terms: AnswerTerms, acceptance: dict) -> AcceptanceCount:
        return answer_rules.count_acceptance(input_request=input_request, terms=terms, acceptance=acceptance)

    def answer_deadline(self, *, terms: AnswerTerms, opened_at) -> AnswerDeadline | None:
        return answer_rules.answer_deadline(terms=terms, opened_at=opened_at)

    def deadline_near_at(self, *, opened_at, deadline):
        return answer_rules.deadline_near_at(opened_at=opened_at, deadline=deadline)

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


@dataclass(frozen=True)
class _EffectivePolicy:
    """What AnswerTerms needs of a policy, with the names it lists and whether they take one user."""

    pk: int
    tool: str
    required_accepts: int
    allow_self_approval: bool
    comment_required_on_decline: bool
    gate_before_call: bool
    answer_within: timedelta | None
    input_from: str
    server_name: str
    group_names: list[str]
    user_names: list[str]
    names_user: bool
    names_group_of_user: bool

    def __str__(self) -> str:  # as ApprovalPolicy.__str__
        return f"{self.server_name} · {self.tool}" if self.tool else f"{self.server_name} (every tool)"


@cache
def _effective_policy_sql() -> str:
    """The tool's and the server's policy (both, if any), their terms, server name and the names they list, and
    whether they name a user (%(user)s, NULL for nobody) or a group of theirs, for the servers %(servers)s and the
    tools %(tools)s; the columns in _EffectivePolicy's field order, which _effective_of fills from each row by
    position, then the policy's server.

    Plain SQL, not the ORM: this is read on every answer, and building the same query with its four subqueries
    through the ORM took 2.5 ms of Python each time against 0.7 ms for Postgres to run it (issue 18, item 1)."""
    user_model = get_user_model()
    policy, server = ApprovalPolicy._meta.db_table, Server._meta.db_table
    policy_users = ApprovalPolicy.users.through._meta.db_table
    policy_groups = ApprovalPolicy.groups.through._meta.db_table
    users, groups = user_model._meta.db_table, Group._meta.db_table
    names_user, names_group_of_user = _names_user_sql()
    username = user_model._meta.get_field(user_model.USERNAME_FIELD).column
    return f"""
        SELECT p.id, p.tool, p.required_accepts, p.allow_self_approval, p.comment_required_on_decline,
               p.gate_before_call, p.answer_within, p.input_from, s.name,
               ARRAY(SELECT g.name FROM "{groups}" g JOIN "{policy_groups}" pg ON pg.group_id = g.id
                     WHERE pg.approvalpolicy_id = p.id),
               ARRAY(SELECT u."{username}" FROM "{users}" u JOIN "{policy_users}" pu ON pu.user_id = u.id
                     WHERE pu.approvalpolicy_id = p.id),
               {names_user},
               {names_group_of_user},
               p.server_id
        FROM "{policy}" p JOIN "{server}" s ON s.id = p.server_id
        WHERE p.server_id = ANY(%(servers)s) AND (p.tool = '' OR p.tool = ANY(%(tools)s))
    """


def _effective_with_names(server_id: int, tool: str, *, user_id: int | None) -> _EffectivePolicy | None:
    """The effective policy (the tool's, else the server's) in one query."""
    return _effective_of([(server_id, tool)], user_id=user_id)[(server_id, tool or "")]


def _effective_of(
    pairs: Iterable[tuple[int, str]], *, user_id: int | None
) -> dict[tuple[int, str], _EffectivePolicy | None]:
    """The effective policy of each (server id, tool), all in one query; the keys' tools are "" for none."""
    pairs = {(server_id, tool or "") for server_id, tool in pairs}
    servers, tools = sorted({server_id for server_id, _ in pairs}), sorted({tool for _, tool in pairs if tool})
    per_server: dict[int, dict[str, _EffectivePolicy]] = defaultdict(dict)
    with connection.cursor() as cursor:
        cursor.execute(_effective_policy_sql(), {"servers": servers, "tools": tools, "user": user_id})
        for *columns, server_id in cursor.fetchall():
            policy = _EffectivePolicy(*columns)
            per_server[server_id][policy.tool] = policy
    return {
        (server_id, tool): per_server[server_id].get(tool) or per_server[server_id].get("") for server_id, tool in pairs
    }


def _terms_and_allows(policy: _EffectivePolicy | None) -> tuple[AnswerTerms, bool]:
    if policy is None:
        return AnswerTerms(), True
    names_anyone = policy.group_names or policy.user_names
    return _terms(policy), not names_anyone or policy.names_user or policy.names_group_of_user


def _terms(policy: _EffectivePolicy) -> AnswerTerms:
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
