"""Home's aggregates over the tasks a person may see, their SQL compiled once where it is everyone's
(taskhub/database/compiled.py).

An operator or admin sees every task (queries.tasks_visible_to: Task.objects.all()), so the statement is the same
for all of them; an approver's is written from their policies and groups, read as the request is answered: it is
compiled each time, as before.
"""

import datetime
from collections.abc import Callable

from django.db.models import QuerySet

from taskhub.accounts import permissions
from taskhub.database.compiled import compiled_rows
from taskhub.tasks.queries import tasks_visible_to


def visible_rows(user, name: str, build: Callable[..., QuerySet], *moments: datetime.datetime) -> list:
    """The rows of build(the tasks `user` sees, *moments), a values_list, as the ORM reads them; `name` tells this
    read from the others (what `build` makes of the tasks must depend on the moments only)."""
    visible = tasks_visible_to(user)
    if permissions.sees_all_tasks(user):  # every task, whoever it is: the same statement for all of them
        return compiled_rows(("every task", name), lambda *values: build(visible, *values), moments)
    return list(build(visible, *moments))
