"""The flush that ends a transactional test runs again when Postgres ends it for a deadlock with a process that
outlived its test (tests/fast_flush.py)."""

import threading

import psycopg
import pytest
from django.core.management.color import no_style
from django.db import connection

from tests import fast_flush


def locks_waited_for(cursor) -> int:
    cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted AND mode = 'AccessExclusiveLock'")
    return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_a_flush_ended_by_a_deadlock_runs_again_once_the_other_transaction_went_on():
    tables = sorted(fast_flush.truncated_tables(connection))
    first, last = tables[0], tables[-1]
    statements = connection.ops.sql_flush(no_style(), tables)
    assert any(statement.startswith("TRUNCATE") for statement in statements)
    dsn = connection.get_connection_params()
    dsn = {key: value for key, value in dsn.items() if key in ("dbname", "user", "host", "port", "password")}
    flushed: list[BaseException | None] = []

    def flush() -> None:
        from django.db import connection as own

        try:
            own.ops.execute_sql_flush(statements)
            flushed.append(None)
        except BaseException as error:
            flushed.append(error)
        finally:
            own.close()

    with psycopg.connect(**dsn) as other, psycopg.connect(**dsn, autocommit=True) as watcher:
        with other.cursor() as reads, watcher.cursor() as watching:
            # The other transaction never detects the deadlock itself: the flush, which waits first, is ended.
            reads.execute("SET deadlock_timeout = '30s'")
            reads.execute(f'SELECT 1 FROM "{last}" LIMIT 1')
            flusher = threading.Thread(target=flush)
            flusher.start()
            while locks_waited_for(watching) == 0:  # the TRUNCATE holds the first tables and waits for the last
                flusher.join(timeout=0.01)
                assert flusher.is_alive(), flushed
            reads.execute(f'SELECT 1 FROM "{first}" LIMIT 1')  # waits for the TRUNCATE: a deadlock
        other.commit()
    flusher.join(timeout=30)
    assert flushed == [None]
