"""A statement on a connection of an asyncio psycopg pool, from the event loop, its row read as Django's own
connections read it, so that model fields convert it as the ORM does: the worker's pool (taskhub/worker/connector.py),
and the event loop's own (`fetch_one_prepared`: daphne's reads that need no thread, the gateway's direct `tasks/get`
and the live sockets' read of a changed task)."""

import asyncio
import functools
import weakref
from collections.abc import Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.backends.postgresql.psycopg_any import register_tzloader
from procrastinate.contrib.django.utils import connector_params
from psycopg import AsyncConnection, AsyncCursor
from psycopg.types.string import TextLoader
from psycopg_pool import AsyncConnectionPool

from taskhub.database import liveness


async def fetch_one(pool: AsyncConnectionPool, sql: str, params: Sequence[Any]) -> tuple | None:
    """The first row of `sql` (None if none), run alone (the pool's connections are in autocommit). Errors are
    Django's (DatabaseError and its kinds), as the ORM raises them."""
    with connection.wrap_database_errors:
        async with pool.connection() as pooled, pooled.cursor() as cursor:
            read_as_django_does(cursor)
            await cursor.execute(sql, params)
            return await cursor.fetchone()


def read_as_django_does(cursor: AsyncCursor | AsyncConnection, *, timezone=None) -> None:
    """The loaders Django registers on its connections (django.db.backends.postgresql.psycopg_any): JSON and network
    addresses as text (JSONField and the address fields parse them), timestamps in Django's zone (`timezone`, else
    the zone of the current Django connection). On a cursor, or once on a connection for all its cursors."""
    for name in ("jsonb", "inet", "cidr"):
        cursor.adapters.register_loader(name, TextLoader)
    register_tzloader(connection.timezone if timezone is None else timezone, cursor)


# The event loop's own connections, per process (per event loop): few, as a read holds one only for its statement.
LOOP_POOL_SIZE = 2
LOOP_POOL_NAME = "taskhub-loop-reads"  # its connections' application_name in pg_stat_activity
# How long a read waits for one of the pool's connections (PoolTimeout after: the caller reads another way).
LOOP_POOL_WAIT_SECONDS = 1.0
PREPARE_THRESHOLD = 5  # psycopg's default; the statements here ask to be prepared at once (prepare=True)
_loop_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Future] = weakref.WeakKeyDictionary()


@functools.cache
def django_side():
    """A DatabaseWrapper of the default database kept for the process, never connected: the converters, the time
    zone and the error wrapping of the event loop's reads. Django's own `connection` is one per asyncio context:
    under daphne a new wrapper (and its introspection, features, operations) for every request that touches it."""
    return connections.create_connection(DEFAULT_DB_ALIAS)


async def fetch_one_prepared(statement: str, params: Sequence[Any]) -> tuple | None:
    """The statement's first row (None if none), on a connection of this event loop's pool, prepared on the server
    (once per connection: Django binds on the client, and Postgres would parse and plan it on every run). Errors
    are Django's (DatabaseError and its kinds), as the ORM raises them; psycopg_pool's PoolTimeout when no connection
    came within LOOP_POOL_WAIT_SECONDS."""
    pool = await _loop_pool()
    with django_side().wrap_database_errors:
        async with pool.connection() as pooled:
            cursor = await pooled.execute(statement, params, prepare=True)
            return await cursor.fetchone()


async def _loop_pool() -> AsyncConnectionPool:
    loop = asyncio.get_running_loop()
    opened = _loop_pools.get(loop)
    if opened is None:
        opened = _loop_pools[loop] = loop.create_future()
        pool = AsyncConnectionPool(
            # Django turns psycopg's prepared statements off (prepare_threshold None); these are prepared.
            kwargs={**connector_params(), "prepare_threshold": PREPARE_THRESHOLD, "application_name": LOOP_POOL_NAME},
            min_size=1,
            max_size=LOOP_POOL_SIZE,
            timeout=LOOP_POOL_WAIT_SECONDS,
            open=False,
            check=liveness.check_pooled,
            configure=_configure,
            name=LOOP_POOL_NAME,
        )
        try:
            await pool.open()
        except BaseException as error:
            del _loop_pools[loop]
            opened.set_exception(error)
            opened.exception()  # retrieved: it is raised here, and to each read that awaited the opening
            raise
        opened.set_result(pool)
    return await asyncio.shield(opened)


async def close_loop_pool() -> None:
    """Close this event loop's pool (tests: its connections keep the test database from being dropped)."""
    opened = _loop_pools.pop(asyncio.get_running_loop(), None)
    if opened is not None and opened.done() and opened.exception() is None:
        await opened.result().close()


async def _configure(pooled: AsyncConnection) -> None:
    await pooled.set_autocommit(True)
    read_as_django_does(pooled, timezone=django_side().timezone)
