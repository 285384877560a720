"""A kept connection's health read from its socket (taskhub/database): a quiet one is used without a query, one that
Postgres ended is found and replaced; for Django's connections and for the worker's procrastinate pool alike. And a
statement on that pool (the delivery job's claim) reads its row as Django's connections do.

Real Postgres: a connection is ended as a restart ends it (pg_terminate_backend: the backend sends FATAL and
closes), and what a backend last ran is read from pg_stat_activity."""

import asyncio
import datetime
import select
import uuid

import psycopg
import pytest
from django.db import DEFAULT_DB_ALIAS, DataError, connection, connections

from taskhub.database import pooled
from taskhub.database.base import DatabaseWrapper
from taskhub.worker.connector import worker_connector

pytestmark = [pytest.mark.django_db, pytest.mark.embedded]


def own_connection() -> DatabaseWrapper:
    """A Django connection of the tests' backend (taskhub's, or the embedded server's built on it), outside the test's
    transaction, health checks on."""
    backend = type(connections[DEFAULT_DB_ALIAS])
    assert issubclass(backend, DatabaseWrapper)
    wrapper = backend({**connection.settings_dict, "CONN_HEALTH_CHECKS": True}, alias="liveness")
    wrapper.ensure_connection()
    return wrapper


def backend_query(pid: int) -> str:
    """What the backend with this pid last ran, asked on another connection."""
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as other:
        return other.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()[0]


def end_backend(pid: int, socket: int) -> None:
    """Ends the backend as a Postgres restart does, and waits until its goodbye reaches the socket."""
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as other:
        assert other.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]
    poller = select.poll()
    poller.register(socket, select.POLLIN)
    assert poller.poll(10_000), "the ended backend's socket never became readable"


@pytest.fixture
async def connector():
    """The worker's connector, open (its pool) on the test's event loop."""
    connector = worker_connector()
    await connector.open_async()
    yield connector
    await connector.close_async()


def test_a_quiet_connection_is_usable_without_a_round_trip():
    wrapper = own_connection()
    try:
        marker = f"SELECT 'liveness {uuid.uuid4()}'"
        with wrapper.cursor() as cursor:
            cursor.execute(marker)
        assert wrapper.is_usable()
        wrapper.close_if_health_check_failed()
        assert wrapper.connection is not None
        # The backend's last statement is still ours: neither check sent `SELECT 1`.
        assert backend_query(wrapper.connection.info.backend_pid) == marker
    finally:
        wrapper.close()


def test_a_connection_postgres_ended_is_replaced_before_the_next_query():
    wrapper = own_connection()
    try:
        ended = wrapper.connection.info.backend_pid
        end_backend(ended, wrapper.connection.pgconn.socket)
        assert not wrapper.is_usable()
        wrapper.health_check_done = False  # as at the start of a request
        with wrapper.cursor() as cursor:  # the health check closes the dead one; this opens a new one
            cursor.execute("SELECT pg_backend_pid()")
            assert cursor.fetchone()[0] != ended
    finally:
        wrapper.close()


def test_a_connection_with_a_transaction_open_is_checked_with_a_query():
    wrapper = own_connection()
    try:
        wrapper.set_autocommit(False)
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT 'in a transaction'")
        assert wrapper.is_usable()
        assert backend_query(wrapper.connection.info.backend_pid) == "SELECT 1"
        wrapper.rollback()
    finally:
        wrapper.close()


async def test_the_worker_pool_checks_a_quiet_connection_without_a_query_and_runs_in_autocommit(connector):
    last_ran: dict[int, str] = {}
    for turn in range(2 * connector.pool.max_size):
        async with connector.pool.connection() as pooled:
            assert pooled.autocommit
            pid = pooled.info.backend_pid
            if pid in last_ran:  # handed out again: the pool's check sent nothing since our statement
                assert await asyncio.to_thread(backend_query, pid) == last_ran[pid]
            last_ran[pid] = f"SELECT 'pool turn {turn} {uuid.uuid4()}'"
            await pooled.execute(last_ran[pid])
    assert len(last_ran) < 2 * connector.pool.max_size, "no connection was handed out twice"


async def test_the_worker_pool_replaces_a_connection_postgres_ended(connector):
    async with connector.pool.connection() as pooled:
        ended, socket = pooled.info.backend_pid, pooled.pgconn.socket
    await asyncio.to_thread(end_backend, ended, socket)
    pids = set()
    for _ in range(connector.pool.max_size + 1):  # every connection of the pool is handed out at least once
        row = await connector.execute_query_one_async("SELECT pg_backend_pid() AS pid")
        pids.add(row["pid"])
    assert ended not in pids


async def test_a_statement_on_the_pool_is_read_as_django_reads_and_fails_with_djangos_errors(connector):
    row = await pooled.fetch_one(connector.pool, "SELECT '{\"a\": 1}'::jsonb, now(), %s", ["x"])
    assert row[0] == '{"a": 1}' and row[2] == "x"  # JSONField parses the text itself
    assert row[1].utcoffset() == datetime.timedelta(0)
    with pytest.raises(DataError):  # Django's, so the jobs' retry rules (DatabaseError) apply
        await pooled.fetch_one(connector.pool, "SELECT 1 / 0", [])
