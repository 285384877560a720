"""Who may do what: the one place roles are decided, used by views, the API and the WebSocket consumer.

Roles are memberships of the groups created by the accounts migration (groups.py):

- approver (`approvers`): answers the input requests of the servers they approve for. Which requests, and on what
  terms (N of M, self-approval, a comment on decline), the approval policies decide (taskhub/approvals): a policy
  naming groups or users is answered only by approvers among them (membership of such a group alone is not
  enough); a server or tool without a policy is answered by every approver.
- operator (`operators`): launches tool calls on enabled servers and cancels tasks.
- agent (`agents`): an account that agents act as through its API tokens (the JSON API, the MCP gateway): launches
  tool calls on enabled servers and follows and cancels the tasks it launched, there only. The pages are for people:
  signed in, an agent-only account sees its home page and its API tokens, no task (the `..._through_token` rules
  below are the API's).
- admin (`admins`, or a superuser): manages servers and their approver groups, reads and exports the
  audit trail, and is an operator too. An admin is **not** an approver unless also in `approvers`:
  DESIGN.md gives answering a server's question to approvers alone, so it is granted explicitly,
  never implied by power.

Anonymous and inactive users have no role. Nothing here caches across requests: a long-lived WebSocket connection
sees a membership change on its next check. Within one HTTP request the roles are read once (roles_once_per_request
in taskhub/accounts/middleware.py): a page asks in its view, its filters, its nav and its template. These functions
answer "may this user?", never "is this the right moment?" (an input request already answered, a task already
finished): the services decide that.
"""

import datetime
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import wraps
from inspect import iscoroutinefunction
from typing import Protocol

from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.contrib.auth.mixins import UserPassesTestMixin
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.utils.text import format_lazy
from django.utils.translation import gettext, gettext_lazy

from taskhub.accounts.groups import ADMINS, AGENTS, APPROVERS, OPERATORS, ROLE_GROUPS
from taskhub.servers.models import Server

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Roles:
    admin: bool = False
    operator: bool = False
    approver: bool = False
    agent: bool = False


NO_ROLES = Roles()

# {user id: Roles} for the HTTP request being answered; None outside one (sockets, workers, tests calling directly).
roles_this_request: ContextVar[dict[int, Roles] | None] = ContextVar("roles_this_request", default=None)


def roles_of(user) -> Roles:
    """All the roles in one query (pages ask for several: the context processor exposes this as `roles`)."""
    if user is None or not user.is_authenticated or not user.is_active:
        return NO_ROLES
    pinned = getattr(user, "taskhub_roles", None)
    if pinned is not None:
        return pinned
    known = roles_this_request.get()
    if known is not None and user.pk in known:
        return known[user.pk]
    roles = roles_from(user, set(user.groups.filter(name__in=ROLE_GROUPS).values_list("name", flat=True)))
    if known is not None:
        known[user.pk] = roles
    return roles


def role_group_names_sql(user_alias: str) -> str:
    """The names of a user's role groups (what roles_of reads, for roles_from) in a hand-written statement whose user
    table is aliased `user_alias`; its one parameter: the role group names (ROLE_GROUPS)."""
    user_model = get_user_model()
    memberships = user_model.groups.through._meta.db_table
    groups = user_model.groups.field.related_model._meta.db_table
    return (
        f'ARRAY(SELECT g.name FROM "{groups}" g JOIN "{memberships}" m ON m.group_id = g.id '
        f"WHERE m.user_id = {user_alias}.id AND g.name = ANY(%s))"
    )


def group_ids_sql(user_alias: str) -> str:
    """The ids of all a user's groups (group_ids_of), in a hand-written statement whose user table is aliased
    `user_alias`."""
    memberships = get_user_model().groups.through._meta.db_table
    return f'ARRAY(SELECT m.group_id FROM "{memberships}" m WHERE m.user_id = {user_alias}.id)'


def group_ids_of(user) -> list[int]:
    """The ids of the user's groups: as the sign-in backend read them with the user (every request's user: one
    statement less where an escalation is asked about), else read once for the request being answered."""
    known = getattr(user, "taskhub_group_ids", None)
    if known is not None:
        return known
    return read_once_per_request("groups", user, lambda: list(user.groups.values_list("pk", flat=True)))


def roles_from(user, group_names: set[str]) -> Roles:
    """The roles of a user in these groups (only ROLE_GROUPS count)."""
    admin = user.is_superuser or ADMINS in group_names
    return Roles(
        admin=admin,
        operator=admin or OPERATORS in group_names,
        approver=APPROVERS in group_names,
        agent=AGENTS in group_names,
    )


def with_roles_read_once(user):
    """Read `user`'s roles now and keep them on this object, which then answers every role question without a query.

    Only for a user object whose holder reads it again when the roles may have changed: the live socket, which
    replaces its user on `access.changed` (taskhub.live.access) and renders each change with it (the fragments
    ask up to eight times per change: bench/freshness.py)."""
    user.taskhub_roles = roles_of(user)
    return user


def is_admin(user) -> bool:
    return roles_of(user).admin


def is_operator(user) -> bool:
    return roles_of(user).operator


def is_approver(user) -> bool:
    return roles_of(user).approver


def is_agent(user) -> bool:
    return roles_of(user).agent


@dataclass(frozen=True)
class AnswerTerms:
    """The terms on which a request is answered: its policy's, or these defaults where no policy applies."""

    policy_id: int | None = None
    policy: str = ""  # how refusals and the audit trail name the policy
    answerers: str = "all approvers"  # "for: …" on cards
    required_accepts: int = 1
    self_approval: bool = True
    comment_on_decline: bool = False
    gate_before_call: bool = False  # a launch waits for an approval before tools/call is sent
    answer_within: datetime.timedelta | None = None  # the answer deadline, from when a request opens
    input_from: str = "people"  # a gateway call's requests: its policy's people, or the agent ("agent")
    rules_missing: bool = False  # CLOSED_TERMS: no approval rules were registered, nothing may be decided


DEFAULT_TERMS = AnswerTerms()

RULES_MISSING = (
    "taskhub.approvals did not register its approval rules at start-up (is it in INSTALLED_APPS, and did its "
    "AppConfig.ready run?): nobody may answer any request, and every launch waits at a gate nobody may pass"
)
# What applies when no approval rules were registered: closed, never the permissive defaults above. Every launch is
# held at the gate (which tools are gated cannot be known), nobody is named to answer, nothing is answered.
CLOSED_TERMS = AnswerTerms(
    policy=f"no approval rules ({RULES_MISSING})",
    answerers="nobody (approval rules not loaded)",
    self_approval=False,
    gate_before_call=True,
    rules_missing=True,
)


@dataclass(frozen=True)
class AcceptanceCount:
    """N of M, once an acceptance arrives: the acceptances recorded on the request with it (for N of one, none are
    kept), the earlier ones that stopped counting (each with "why"), and whether they are enough for the answer."""

    acceptances: list[dict]
    discounted: list[dict]
    enough: bool
    required: int


@dataclass(frozen=True)
class AnswerDeadline:
    """When a request opened now must be answered, and when that deadline counts as near (its notice goes out)."""

    at: datetime.datetime
    near_at: datetime.datetime


class AnswerPolicies(Protocol):
    """What taskhub.approvals registers at startup (it sits above this layer, which never imports it)."""

    def servers(self, user) -> QuerySet[Server]: ...  # servers with any request the user may answer
    def requests(self, user) -> Q: ...  # over InputRequest: those the user may answer
    def servers_refusing_some(self, user) -> set[int]: ...  # servers where requests() leaves some out
    def for_me(self, user) -> Q: ...  # over InputRequest: those whose policy names the user (or a group of theirs)
    def terms(self, server_id: int, tool: str) -> AnswerTerms: ...
    # terms_and_allows() of each (server id, tool), in one query; the keys' tools are "" for none
    def terms_and_allows_of(
        self, user, pairs: Iterable[tuple[int, str]]
    ) -> dict[tuple[int, str], tuple[AnswerTerms, bool]]: ...
    def answerers(self, server_id: int, tool: str) -> Q: ...  # over the user model: those the policy names
    def terms_and_allows(self, user, server_id: int, tool: str) -> tuple[AnswerTerms, bool]: ...  # both, one query
    # The approval rules of one answer and one request (taskhub.approvals.answer_rules); the task services apply
    # what these decide and decide none of it themselves.
    def answer_refusal(self, *, input_request, answer: dict, user, terms: AnswerTerms, comment: str) -> str: ...
    def launcher_barred(self, *, input_request, user, terms: AnswerTerms) -> bool: ...
    def count_acceptance(self, *, input_request, terms: AnswerTerms, acceptance: dict) -> AcceptanceCount: ...
    def answer_deadline(self, *, terms: AnswerTerms, opened_at: datetime.datetime) -> AnswerDeadline | None: ...
    def deadline_near_at(self, *, opened_at: datetime.datetime, deadline: datetime.datetime) -> datetime.datetime: ...


_answer_policies: list[AnswerPolicies] = []


def register_answer_policies(policies: AnswerPolicies) -> None:
    _answer_policies[:] = [policies]


def answer_policies() -> AnswerPolicies | None:
    """The registered approval rules; None only when taskhub.approvals did not register them, and then every
    question below is answered closed (nobody, nothing, CLOSED_TERMS), with an error in the log."""
    if _answer_policies:
        return _answer_policies[0]
    logger.error("%s", RULES_MISSING)
    return None


# {(question, user id): answer} of the approval rules' questions about a person (taskhub/approvals/rules.py: which
# policies leave them what, their groups), for the HTTP request being answered (read_once): Home asks them for its
# panels and again for the nav's count, the inbox for its listing and its cards (bench/pages.py).
rules_this_request: ContextVar[dict[tuple[str, int], object] | None] = ContextVar("rules_this_request", default=None)


def read_once_per_request[T](question: str, user, read: Callable[[], T]) -> T:
    """`read()`, or what it gave for the same question about the same user earlier in this request (read_once)."""
    known = rules_this_request.get()
    if known is None:
        return read()
    key = (question, user.pk)
    if key not in known:
        known[key] = read()
    return known[key]  # type: ignore[return-value]


def servers_user_may_approve(user) -> QuerySet[Server]:
    """The servers with requests this user may answer; a queryset, so the inbox can filter by it. Which requests
    of them: requests_user_may_answer."""
    if not is_approver(user):
        return Server.objects.none()
    policies = answer_policies()
    return policies.servers(user) if policies is not None else Server.objects.none()


def approvable_servers(user) -> dict[int, bool]:
    """{id: enabled} of servers_user_may_approve, by name, read once for the HTTP request being answered (read_once):
    the nav's access and its waiting count, the inbox, the list's counts and Home's trends each read them."""
    return read_once_per_request(
        "approvable servers", user, lambda: dict(servers_user_may_approve(user).values_list("pk", "enabled"))
    )


def requests_user_may_answer(user) -> Q:
    """Over InputRequest, within servers_user_may_approve: the requests whose policy lets this user answer."""
    if not is_approver(user):
        return Q(pk__in=[])
    policies = answer_policies()
    return policies.requests(user) if policies is not None else Q(pk__in=[])


def servers_answered_in_part(user) -> set[int]:
    """The servers where requests_user_may_answer refuses this user some requests by policy (on the others, only a
    request escalated away at its deadline is not theirs): "waiting for me" counts those servers' requests one by
    one, the others' from the kept per-server counts (taskhub/tasks/waiting.py)."""
    policies = answer_policies()
    if policies is None or not is_approver(user):
        return set()
    return policies.servers_refusing_some(user)


def requests_for_me(user) -> Q:
    """Over InputRequest: the requests whose policy names this user or a group of theirs (the inbox's "for me")."""
    policies = answer_policies()
    return policies.for_me(user) if policies is not None and is_approver(user) else Q(pk__in=[])


# {(server id, tool): AnswerTerms} for the HTTP request being answered (an inbox page asks once per card).
terms_this_request: ContextVar[dict[tuple[int, str], AnswerTerms] | None] = ContextVar(
    "terms_this_request", default=None
)


def read_answer_rules(user, pairs: Iterable[tuple[int, str]]) -> None:
    """For a page of many requests (the inbox): the terms of each (server id, tool), and whether its policy names
    `user`, read in one query for this request (read_once), where answer_terms and policy_allows would read them one
    pair at a time. Outside read_once, nothing."""
    policies = answer_policies()
    terms_known, allowed_known = terms_this_request.get(), allowed_this_request.get()
    if policies is None or terms_known is None or allowed_known is None:
        return
    asked = {(server_id, tool or "") for server_id, tool in pairs}
    missing = {pair for pair in asked if pair not in terms_known or (user.pk, *pair, None) not in allowed_known}
    if missing:
        for (server_id, tool), (terms, allowed) in policies.terms_and_allows_of(user, missing).items():
            terms_known.setdefault((server_id, tool), terms)
            allowed_known.setdefault((user.pk, server_id, tool, None), allowed)


def answer_terms(*, server_id: int, tool: str) -> AnswerTerms:
    policies = answer_policies()
    if policies is None:
        return CLOSED_TERMS
    known = terms_this_request.get()
    if known is not None and (server_id, tool) in known:
        return known[(server_id, tool)]
    terms = policies.terms(server_id, tool)
    if known is not None:
        known[(server_id, tool)] = terms
    return terms


def answer_refusal(*, input_request, answer: dict, user, terms: AnswerTerms, comment: str) -> str:
    """Why the request's approval rules do not let `user` give this answer now ("" when they do). With no rules
    registered, nobody may."""
    policies = answer_policies()
    if policies is None:
        return f"Nobody may answer: {RULES_MISSING}."
    return policies.answer_refusal(input_request=input_request, answer=answer, user=user, terms=terms, comment=comment)


def launcher_barred(*, input_request, user, terms: AnswerTerms) -> bool:
    """Whether `user` may not answer this request because they launched its task (self-approval refused), which
    their card says instead of offering a form. With no rules registered, nobody may answer anyway: False."""
    policies = answer_policies()
    return policies is not None and policies.launcher_barred(input_request=input_request, user=user, terms=terms)


def count_acceptance(*, input_request, terms: AnswerTerms, acceptance: dict) -> AcceptanceCount:
    """N of M, when `acceptance` arrives: which acceptances count and whether they are enough. With no rules
    registered, none counts and nothing is ever enough."""
    policies = answer_policies()
    if policies is None:
        earlier = [entry for entry in input_request.acceptances or [] if isinstance(entry, dict)]
        discounted = [{**entry, "why": "approval rules not loaded"} for entry in earlier]
        return AcceptanceCount(acceptances=[], discounted=discounted, enough=False, required=terms.required_accepts)
    return policies.count_acceptance(input_request=input_request, terms=terms, acceptance=acceptance)


def answer_deadline(*, terms: AnswerTerms, opened_at: datetime.datetime) -> AnswerDeadline | None:
    """The deadline of a request that opened at `opened_at` under these terms (None: it has none)."""
    policies = answer_policies()
    return policies.answer_deadline(terms=terms, opened_at=opened_at) if policies is not None else None


def deadline_near_at(*, opened_at: datetime.datetime, deadline: datetime.datetime) -> datetime.datetime:
    """When a request's deadline counts as near (cards show it so); with no rules registered, at the deadline."""
    policies = answer_policies()
    return policies.deadline_near_at(opened_at=opened_at, deadline=deadline) if policies is not None else deadline


def sees_all_tasks(user) -> bool:
    """Operators (and so admins) watch every task; the live socket's `tasks` group follows this too."""
    return is_operator(user)


def may_see_task(user, task) -> bool:
    if sees_all_tasks(user):
        return True
    return servers_user_may_approve(user).filter(pk=task.server_id).exists()


def may_see_task_through_token(user, task) -> bool:
    """What a caller holding an API token may follow: what its user sees on the pages, and an agent its own tasks."""
    return (is_agent(user) and task.launched_by_id == user.pk) or may_see_task(user, task)


def _named_to_answer(*, server_id: int, tool: str, escalated_to_id: int | None) -> Q:
    """Over the user model, whatever their roles: the escalation group of a request handed over at its deadline,
    else the people its policy names (everyone where it names nobody, or where no policy applies); nobody when no
    approval rules were registered."""
    policies = answer_policies()
    if policies is None:
        return Q(pk__in=[])
    if escalated_to_id is not None:
        return Q(pk__in=get_user_model().groups.through.objects.filter(group_id=escalated_to_id).values("user_id"))
    return policies.answerers(server_id, tool)


def users_who_may_answer(*, server_id: int, tool: str, escalated_to_id: int | None = None) -> QuerySet:
    """Who may answer a request of `tool` on the server (escalated to a group, or not): the people mailed about the
    request (taskhub.approvals.notifications.recipients). may_answer and policy_allows ask the same of one user in
    the plain statement that also reads the terms (approvals.rules), for an escalated request with this filter;
    test_approval_rules holds the two to the same people. Active approvers only. Self-approval is not decided
    here: the launcher may answer in this sense, and the answer service refuses their answer where the policy says
    so."""
    approvers = get_user_model().groups.through.objects.filter(group__name=APPROVERS).values("user_id")
    return (
        get_user_model()
        .objects.filter(is_active=True, pk__in=approvers)
        .filter(_named_to_answer(server_id=server_id, tool=tool, escalated_to_id=escalated_to_id))
    )


# {(user id, server id, tool, escalation group id): allowed} for the HTTP request being answered: the answer view
# asks before it parses the answer, and the answer service asks again under the task's lock.
allowed_this_request: ContextVar[dict[tuple[int, int, str, int | None], bool] | None] = ContextVar(
    "allowed_this_request", default=None
)


@contextmanager
def read_once() -> Iterator[None]:
    """Inside, roles, answer terms, whether a policy names a user and what the policies leave a user are each read
    once: for one HTTP request (accounts.middleware) or one live change rendered for its sockets
    (live.access.rendering_for), which ask each of them once per card."""
    roles, terms, allowed = roles_this_request.set({}), terms_this_request.set({}), allowed_this_request.set({})
    rules = rules_this_request.set({})
    try:
        yield
    finally:
        rules_this_request.reset(rules)
        allowed_this_request.reset(allowed)
        terms_this_request.reset(terms)
        roles_this_request.reset(roles)


def _named(user, *, server_id: int, tool: str, escalated_to_id: int | None) -> bool:
    """Whether users_who_may_answer's choice of people takes `user`, roles aside (one query, once per HTTP request
    or live rendering: read_once)."""
    known = allowed_this_request.get()
    key = (user.pk, server_id, tool, escalated_to_id)
    if known is not None and key in known:
        return known[key]
    policies = answer_policies()
    if policies is None:
        allowed = False  # closed: no rules say who may
    elif escalated_to_id is None:
        # The same people as _named_to_answer's filter; one plain statement that also reads the terms, which the
        # answer view, a card and the answer service then ask for.
        terms, allowed = policies.terms_and_allows(user, server_id, tool)
        terms_known = terms_this_request.get()
        if terms_known is not None:
            terms_known.setdefault((server_id, tool), terms)
    else:
        named = _named_to_answer(server_id=server_id, tool=tool, escalated_to_id=escalated_to_id)
        allowed = get_user_model().objects.filter(named, pk=user.pk).exists()
    if known is not None:
        known[key] = allowed
    return allowed


def policy_allows(user, *, server_id: int, tool: str) -> bool:
    """Whether the policy of a server's tool names this user (or a group of theirs, or nobody): the services' check,
    which leaves the approver role to the callers."""
    return _named(user, server_id=server_id, tool=tool, escalated_to_id=None)


def may_answer(user, input_request) -> bool:
    """Whether `user` is among users_who_may_answer for this request (each read once per HTTP request)."""
    if not is_approver(user):
        return False
    task = input_request.task
    return _named(user, server_id=task.server_id, tool=task.tool, escalated_to_id=input_request.escalated_to_id)


def in_escalation_group(user, input_request) -> bool:
    """Whether `user` is in the group an escalated request was handed to (may_answer's question, roles aside: the
    same key, so the answer service's check under the lock reuses the view's answer)."""
    task = input_request.task
    return input_request.escalated_to_id is not None and _named(
        user, server_id=task.server_id, tool=task.tool, escalated_to_id=input_request.escalated_to_id
    )


def may_cancel(user, task) -> bool:
    """Operators cancel any task; an agent the tasks it launched."""
    return is_operator(user) or (is_agent(user) and task.launched_by_id == user.pk)


def may_launch(user, server) -> bool:
    """From the pages: operators."""
    return server.enabled and is_operator(user)


def may_launch_through_token(user, server) -> bool:
    """From the JSON API or the MCP gateway, with an API token: operators and agents."""
    return server.enabled and (is_operator(user) or is_agent(user))


def launches_through_token(user) -> bool:
    """Whether a token's user may launch at all (on some enabled server): operators and agents."""
    return is_operator(user) or is_agent(user)


def _role_required(has_role, who: str):
    """Anonymous users go to the login page; signed-in users without the role get 403 saying who may."""
    refusal = format_lazy(gettext_lazy("This page is for {}."), who)

    def decorator(view):
        if iscoroutinefunction(view):

            @wraps(view)
            async def async_view(request, *args, **kwargs):
                user = await request.auser()
                if not user.is_authenticated:
                    return redirect_to_login(request.get_full_path())
                if not await sync_to_async(has_role)(user):
                    raise PermissionDenied(refusal)
                return await view(request, *args, **kwargs)

            return async_view

        @wraps(view)
        def sync_view(request, *args, **kwargs):
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            if not has_role(request.user):
                raise PermissionDenied(refusal)
            return view(request, *args, **kwargs)

        return sync_view

    return decorator


approver_required = _role_required(is_approver, gettext_lazy("approvers"))
operator_required = _role_required(is_operator, gettext_lazy("operators"))
admin_required = _role_required(is_admin, gettext_lazy("admins"))
signed_in_required = _role_required(lambda user: True, gettext_lazy("people who are signed in"))


class _RoleRequiredMixin(UserPassesTestMixin):
    # UserPassesTestMixin already sends anonymous users to login and answers others with 403.
    has_role = staticmethod(lambda user: False)
    who = gettext_lazy("nobody")

    def test_func(self) -> bool:
        return self.has_role(self.request.user)

    def get_permission_denied_message(self) -> str:
        return gettext("This page is for %(who)s.") % {"who": self.who}


class ApproverRequiredMixin(_RoleRequiredMixin):
    has_role = staticmethod(is_approver)
    who = gettext_lazy("approvers")


class OperatorRequiredMixin(_RoleRequiredMixin):
    has_role = staticmethod(is_operator)
    who = gettext_lazy("operators")


class AdminRequiredMixin(_RoleRequiredMixin):
    has_role = staticmethod(is_admin)
    who = gettext_lazy("admins")
