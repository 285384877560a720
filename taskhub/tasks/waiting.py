"""One definition of "waiting for me" (issue 34, item 2): the open input requests a person may answer (their
approval policies and escalations: permissions.requests_user_may_answer) on the enabled servers they approve for. The
nav's Inbox badge and the tab title, Home, the unfiltered inbox (the cards listed, those grouped in floods) and
GET /api/inbox all count these: a disabled server's requests are not waiting (the inbox shows them on request).

Counted fast, as the nav needs on every page at a million tasks: per server from the counts triggers keep
(observability.counts), except on the servers where the rules refuse this person some requests (a tool's policy, an
escalation to another group): those servers' open requests are counted one by one, through the open-request index.
"""

from functools import cache

from django.db.models import QuerySet

from taskhub.accounts import permissions
from taskhub.database.prepared import prepared_cursor
from taskhub.observability import counts
from taskhub.servers.models import Server
from taskhub.tasks.models import InputRequest, InputRequestState


def waiting_for(user, *, server_ids=None, include_disabled: bool = False) -> QuerySet[InputRequest]:
    """The requests waiting for `user` (in `server_ids` if given, read as the servers they approve for)."""
    if server_ids is None:
        ids = [pk for pk, enabled in permissions.approvable_servers(user).items() if enabled or include_disabled]
    else:
        ids = list(server_ids)
    return InputRequest.objects.filter(
        permissions.requests_user_may_answer(user), state=InputRequestState.OPEN, server__in=ids
    )


def waiting_count(user, *, approvable_server_ids=None) -> int:
    """How many requests wait for `user`; `approvable_server_ids`: permissions.servers_user_may_approve's ids, when
    the caller has them (the live access)."""
    approvable = permissions.approvable_servers(user)
    ids = set(approvable if approvable_server_ids is None else approvable_server_ids)
    if ids <= approvable.keys():
        enabled = {pk for pk in ids if approvable[pk]}
    else:  # a live audience's servers, read when its access was: whether each is enabled now
        enabled = set(Server.objects.filter(pk__in=list(ids), enabled=True).values_list("pk", flat=True))
    if not enabled:
        return 0
    in_part = permissions.servers_answered_in_part(user) & enabled
    with prepared_cursor() as cursor:
        cursor.execute(_servers_with_escalations_sql(), [list(enabled)])
        escalated = {server_id for (server_id,) in cursor.fetchall()}
    one_by_one = in_part | escalated
    whole = enabled - one_by_one
    total = counts.open_input_requests(server_ids=whole) if whole else 0
    if one_by_one:
        total += waiting_for(user, server_ids=one_by_one).count()
    return total


@cache
def _servers_with_escalations_sql() -> str:
    """Of these servers, those with an open request escalated to a group (its deadline passed): one statement prepared
    on the server, where the ORM built it for every page's nav count and every live change's. The state is written in,
    not a parameter: a plan made for any state could not use the partial index of escalated open requests."""
    requests = InputRequest._meta
    server, state = requests.get_field("server").column, requests.get_field("state").column
    escalated_to = requests.get_field("escalated_to").column
    return (
        f'SELECT DISTINCT "{server}" FROM "{requests.db_table}" '
        f'WHERE "{state}" = \'{InputRequestState.OPEN.value}\' AND "{escalated_to}" IS NOT NULL '
        f'AND "{server}" = ANY(%s)'
    )
