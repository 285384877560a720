"""A page of input requests as their cards read them (input_cards.for_cards), by their ids: the inbox's page.

Which requests a page shows is the ORM's to say (tasks/waiting.py, inbox_listing.py, with the approval rules they
apply); what it shows of each is read here, by one statement written and prepared once, where the ORM built that
select_related and only() again for every page: 2 ms of the inbox's CPU at 1,000,000 tasks (bench/pages.py).
"""

import functools

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from taskhub.database.prepared import prepared_cursor
from taskhub.servers.models import Server
from taskhub.tasks import raw_rows
from taskhub.tasks.input_cards import CARD_TASK_READS
from taskhub.tasks.models import InputRequest, Task


def requests_for_cards(ids: list[int]) -> list[InputRequest]:
    """The requests `ids` (oldest first, as the inbox lists them) as for_cards reads them, with their tasks, servers,
    answerers and groups."""
    if not ids:
        return []
    statement, (request_end, task_end, server_end, user_end, _) = _read()
    with prepared_cursor() as cursor:
        cursor.execute(statement, [list(ids)])
        rows = cursor.fetchall()
    requests = []
    for row in rows:
        (input_request,) = raw_rows.instances(row[:request_end], (InputRequest,))
        (task,) = raw_rows.instances(row[request_end:task_end], (Task,), only=_TASK_READS)
        (server,) = raw_rows.instances(row[task_end:server_end], (Server,), only=_SERVER_READS)
        raw_rows.relate(task, "server", server)
        raw_rows.relate(input_request, "task", task)
        # An open request has neither: no instance is built to be dropped (a third of the statement's time).
        answered_by = group = None
        if input_request.answered_by_id is not None:
            (answered_by,) = raw_rows.instances(row[server_end:user_end], (get_user_model(),))
        if input_request.escalated_to_id is not None:
            (group,) = raw_rows.instances(row[user_end:], (Group,))
        raw_rows.relate(input_request, "answered_by", answered_by)
        raw_rows.relate(input_request, "escalated_to", group)
        requests.append(input_request)
    return requests


# CARD_TASK_READS by model: the task's own, and its server's.
_TASK_READS = tuple(name.split("__", 1)[1] for name in CARD_TASK_READS if name.count("__") == 1)
_SERVER_READS = tuple(name.split("__", 2)[2] for name in CARD_TASK_READS if name.count("__") == 2)


@functools.cache
def _read() -> tuple[str, tuple[int, ...]]:
    """The statement, and where each model's columns end in its rows."""
    return raw_rows.joined_read(
        ("r", InputRequest, None, None, False),
        ("t", Task, _TASK_READS, "t.id = r.task_id", False),
        ("s", Server, _SERVER_READS, "s.id = t.server_id", False),
        ("u", get_user_model(), None, "u.id = r.answered_by_id", True),
        ("g", Group, None, "g.id = r.escalated_to_id", True),
        where="r.id = ANY(%s) ORDER BY r.created_at, r.id",
    )
