"""The end of each transactional test, faster: Django's flush empties every table with one TRUNCATE, which costs
Postgres ~440 ms for taskhub's 29 tables even when they hold a test's few rows (new files for each table and index);
DELETE of those few rows costs ~25 ms for all of them. Several hundred transactional tests end so.

Still emptied with TRUNCATE: the tables with triggers, and the tables that reference them (TRUNCATE must take those
along). DELETE would fire their triggers: the counts kept by triggers would count the deletions, and the audit table
refuses DELETE. The foreign keys Django creates are deferrable, so the DELETEs run in any order inside the flush's
transaction. Installed for the test process only (conftest.py); a flush with reset_sequences or allow_cascade is
Django's own.

A process that outlives its test (the browser tests' one daphne, a worker finishing a job) may read two of the
truncated tables in one transaction while the TRUNCATE waits for the first of them: Postgres ends one of the two
("deadlock detected"). When it ends the flush, the flush runs again (execute_sql_flush): that process's transaction
went on, and the TRUNCATE now waits for its end. CI met it once in a browser test's teardown.
"""

import psycopg
from django.db import OperationalError
from django.db.backends.postgresql.operations import DatabaseOperations

FLUSH_TRIES = 3

_truncating_sql_flush = DatabaseOperations.sql_flush
_executing_sql_flush = DatabaseOperations.execute_sql_flush
_truncated_tables: dict[str, frozenset[str]] = {}

# The tables with (non-internal) triggers, and, transitively, every table whose foreign key references one.
TRUNCATED_SQL = """
    WITH RECURSIVE truncated(oid) AS (
        SELECT DISTINCT tgrelid FROM pg_trigger WHERE NOT tgisinternal
        UNION
        SELECT constraints.conrelid FROM pg_constraint AS constraints
        JOIN truncated ON constraints.confrelid = truncated.oid WHERE constraints.contype = 'f'
    )
    SELECT relname FROM pg_class JOIN truncated USING (oid)
"""


def truncated_tables(connection) -> frozenset[str]:
    if connection.alias not in _truncated_tables:
        with connection.cursor() as cursor:
            cursor.execute(TRUNCATED_SQL)
            _truncated_tables[connection.alias] = frozenset(name for (name,) in cursor.fetchall())
    return _truncated_tables[connection.alias]


def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
    if reset_sequences or allow_cascade or not tables:
        return _truncating_sql_flush(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
    truncated = truncated_tables(self.connection)
    statements = ["SET CONSTRAINTS ALL DEFERRED"]
    # TRUNCATE first: a table with pending (deferred) trigger events of a DELETE could not be truncated after it.
    statements += _truncating_sql_flush(self, style, sorted(set(tables) & truncated))
    statements += [f"DELETE FROM {self.quote_name(table)}" for table in tables if table not in truncated]
    return statements


def execute_sql_flush(self, sql_list):
    for attempt in range(1, FLUSH_TRIES + 1):
        try:
            return _executing_sql_flush(self, sql_list)
        except OperationalError as error:
            if attempt == FLUSH_TRIES or not isinstance(error.__cause__, psycopg.errors.DeadlockDetected):
                raise


def install() -> None:
    DatabaseOperations.sql_flush = sql_flush
    DatabaseOperations.execute_sql_flush = execute_sql_flush
