"""A page of the task list's rows by their ids: what with_row_facts, select_related of the server, the launcher and
who asked to cancel, and only(ROW_FIELDS) read (taskhub/tasks/outcomes.py), in one statement written and prepared once.

Which tasks a page shows, and in which order, is the ORM's to say (the list's filters, tabs and pager,
taskhub/tasks/views/listing.py): it reads their ids alone, and this their rows, given back in the order of the ids.
The ORM built that read again for every page: 1.4-1.7 ms of the list's CPU at 1,000,000 tasks (bench/pages.py).
"""

import functools
import json

from django.contrib.auth import get_user_model

from taskhub.database.prepared import prepared_cursor
from taskhub.servers.models import Server
from taskhub.tasks import raw_rows
from taskhub.tasks.models import Task
from taskhub.tasks.outcomes import PREVIEW_CHARS, ROW_FIELDS

# ROW_FIELDS by model: the task's own (with the keys of the rows it is read with), its server's, its people's.
_TASK_READS = (
    *(name for name in ROW_FIELDS if "__" not in name),
    "server",
    "launched_by",
    "cancel_requested_by",
)
_SERVER_READS = tuple(name.split("__", 1)[1] for name in ROW_FIELDS if name.startswith("server__"))
_PERSON_READS = ("username",)
# with_row_facts's annotations, as its Left(KT(…)) and KeyTransform write them; isError is JSON, decoded here.
_FACTS = (
    f"left(t.error ->> 'code', 40), left(t.error ->> 'kind', 40), "
    f"left(t.result #>> '{{content,0,text}}', {PREVIEW_CHARS}), (t.result -> 'isError')::text"
)


def rows_by_ids(ids: list) -> list[Task]:
    """The tasks `ids`, in that order, as the list's rows read them (with_row_facts's facts on each); a task gone
    meanwhile is left out."""
    if not ids:
        return []
    statement, (task_end, server_end, launcher_end, canceller_end) = _read()
    with prepared_cursor() as cursor:
        cursor.execute(statement, [list(ids)])
        rows = cursor.fetchall()
    people = get_user_model()
    read = {}
    for row in rows:
        (task,) = raw_rows.instances(row[:task_end], (Task,), only=_TASK_READS)
        (server,) = raw_rows.instances(row[task_end:server_end], (Server,), only=_SERVER_READS)
        raw_rows.relate(task, "server", server)
        launcher = canceller = None
        if task.launched_by_id is not None:
            (launcher,) = raw_rows.instances(row[server_end:launcher_end], (people,), only=_PERSON_READS)
        if task.cancel_requested_by_id is not None:
            (canceller,) = raw_rows.instances(row[launcher_end:canceller_end], (people,), only=_PERSON_READS)
        raw_rows.relate(task, "launched_by", launcher)
        raw_rows.relate(task, "cancel_requested_by", canceller)
        task.error_code, task.error_kind, task.result_preview, is_error = row[canceller_end:]
        task.result_is_error = None if is_error is None else json.loads(is_error)
        read[task.pk] = task
    return [read[pk] for pk in ids if pk in read]


@functools.cache
def _read() -> tuple[str, tuple[int, ...]]:
    """The statement, and where each model's columns end in its rows (the facts follow the last)."""
    people = get_user_model()
    return raw_rows.joined_read(
        ("t", Task, _TASK_READS, None, False),
        ("s", Server, _SERVER_READS, "s.id = t.server_id", False),
        ("lb", people, _PERSON_READS, "lb.id = t.launched_by_id", True),
        ("cb", people, _PERSON_READS, "cb.id = t.cancel_requested_by_id", True),
        also=_FACTS,
        where="t.id = ANY(%s)",
    )
