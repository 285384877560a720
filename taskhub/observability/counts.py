"""Counts kept by triggers as rows of changes (models.py; migrations 0001 and 0002), summed by every scrape:
tasks by server and status, input requests open and answered by server, poll rows by lease owner and failing poll
rows by server and failures in a row. A table is
folded (its rows replaced by one per key) by the scrape that finds more than FOLD_ROWS rows in it, and by a
periodic job (sweeps.py), so that each stays small even where nothing scrapes /metrics."""

from __future__ import annotations

from django.db import connection, transaction

FOLD_ROWS = 500
FOLD_LOCK = 0x7A5C_0B5E  # pg_try_advisory_xact_lock key: one fold at a time; the others do without

# Each table of changes and the columns its counts are kept by.
TASKS = ("observability_taskstatusdelta", "server_id, status")
INPUT_REQUESTS = ("observability_inputrequeststatedelta", "server_id, state")
LEASES = ("observability_leaseownerdelta", "owner")
POLL_FAILURES = ("observability_pollfailuredelta", "server_id, failures")
TABLES = (TASKS, INPUT_REQUESTS, LEASES, POLL_FAILURES)


def sum_sql(table: str, keys: str) -> str:
    """(keys…, count, rows of changes): the rows say whether a fold is due."""
    return f"SELECT {keys}, sum(delta), count(*) FROM {table} GROUP BY {keys}"


# Rows inserted meanwhile by transactions not yet committed are not seen, so not deleted: they are summed next time.
def fold_sql(table: str, keys: str) -> str:
    return f"""
WITH gone AS (DELETE FROM {table} RETURNING {keys}, delta)
INSERT INTO {table} ({keys}, delta)
SELECT {keys}, sum(delta) FROM gone GROUP BY {keys} HAVING sum(delta) <> 0
"""


TASKS_SQL = sum_sql(*TASKS)


def task_counts(cursor) -> list[tuple[int, str, int]]:
    """(server id, status, tasks) for each pair with tasks."""
    return _counts(cursor, TASKS)


def input_request_counts(cursor) -> list[tuple[int, str, int]]:
    """(server id, state, input requests) for each pair with requests; states open and answered only."""
    return _counts(cursor, INPUT_REQUESTS)


def lease_counts(cursor) -> list[tuple[str, int]]:
    """(owner, poll rows naming it as their lease owner, expired leases included) for each owner with rows."""
    return _counts(cursor, LEASES)


def poll_failure_counts(cursor) -> list[tuple[int, int, int]]:
    """(server id, failures in a row, poll rows failing that many times) for each pair with rows."""
    return _counts(cursor, POLL_FAILURES)


def _counts(cursor, table: tuple[str, str]) -> list:
    """The sums per key; folds the table if it has many rows (in the caller's transaction)."""
    counted, fold_due = _sums(cursor, table)
    if fold_due:
        _fold(cursor, [table])
    return counted


def _sums(cursor, table: tuple[str, str]) -> tuple[list, bool]:
    """The sums per key, and whether the table has rows enough to fold."""
    cursor.execute(sum_sql(*table))
    rows = cursor.fetchall()
    return [row[:-1] for row in rows if row[-2]], sum(row[-1] for row in rows) > FOLD_ROWS


def fold() -> bool:
    """Fold every table into one row per key, unless another fold is under way. Whether it folded."""
    with transaction.atomic(), connection.cursor() as cursor:
        return _fold(cursor, TABLES)


def _fold(cursor, tables) -> bool:
    cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [FOLD_LOCK])
    if not cursor.fetchone()[0]:
        return False
    for table in tables:
        cursor.execute(fold_sql(*table))
    return True


# The pages read the same sums (the task list's status tabs, the navigation's counts): one small table each instead
# of a count over every task or open request.


def tasks_per_status(*, server_ids=None) -> dict[str, int]:
    """Tasks per status, over every server or those in `server_ids`."""
    rows = _counts_read_alone(TASKS)
    totals: dict[str, int] = {}
    for server_id, status, count in rows:
        if server_ids is None or server_id in server_ids:
            totals[status] = totals.get(status, 0) + count
    return totals


def open_input_requests(*, server_ids) -> int:
    """Open input requests of the servers in `server_ids`."""
    rows = _counts_read_alone(INPUT_REQUESTS)
    return sum(count for server_id, state, count in rows if state == "open" and server_id in server_ids)


def _counts_read_alone(table: tuple[str, str]) -> list:
    """_counts without a transaction around the read (one statement sees one snapshot): a page or a live change reads
    these on every render, and BEGIN and COMMIT were two of its round trips. A fold that is due has one of its own."""
    with connection.cursor() as cursor:
        counted, fold_due = _sums(cursor, table)
    if fold_due:
        with transaction.atomic(), connection.cursor() as cursor:
            _fold(cursor, [table])
    return counted
