"""Home's aggregates over the tasks a person may see, their SQL compiled once per statement of those tasks
(taskhub/database/compiled.py).

An operator or admin sees every task (queries.tasks_visible_to: Task.objects.all()), so the statement is the same
for all of them; an approver's is written from their policies and groups, read as the request is answered: it is kept
under the statement of their visible tasks, whose text and parameters it is built from.
"""

import datetime
from collections.abc import Callable

from django.core.exceptions import EmptyResultSet
from django.db.models import QuerySet

from taskhub.accounts import permissions
from taskhub.database.compiled import compiled_rows
from taskhub.tasks.queries import tasks_visible_to


def visible_rows(user, name: str, build: Callable[..., QuerySet], *moments: datetime.datetime) -> list:
    """The rows of build(the tasks `user` sees, *moments), a values_list, as the ORM reads them; `name` tells this
    read from the others (what `build` makes of the tasks must depend on the moments only)."""
    visible = tasks_visible_to(user)
    if permissions.sees_all_tasks(user):  # every task, whoever it is: the same statement for all of them
        key = ("every task", name)
    else:
        statement = permissions.read_once_per_request(
            "the statement of the tasks seen", user, lambda: _statement(visible)
        )
        if statement is None:
            return list(build(visible, *moments))
        key = ("these tasks", name, *statement)
    return compiled_rows(key, lambda *values: build(visible, *values), moments)


def _statement(visible: QuerySet) -> tuple | None:
    """What the reads over `visible`, an approver's tasks, are kept under: its statement and parameters, which their
    policies and groups wrote (approvers whom the same servers' policies let answer everything share it). Compiling
    it costs about 1.2 ms, a fraction of an aggregate's compiling; Home's three reads ask it once a request. None where
    it cannot be a key (nothing to read, a parameter that is no hashable value)."""
    try:
        sql, params = visible.values("pk").query.sql_with_params()
        statement = (sql, tuple(params))
        hash(statement)
    except (EmptyResultSet, TypeError):
        return None
    return statement
