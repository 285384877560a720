"""A statement on a connection of an asyncio psycopg pool (the worker's: taskhub/worker/connector.py), from the event
loop, its row read as Django's own connections read it, so that model fields convert it as the ORM does."""

from collections.abc import Sequence
from typing import Any

from django.db import connection
from django.db.backends.postgresql.psycopg_any import register_tzloader
from psycopg import AsyncConnection, AsyncCursor
from psycopg.types.string import TextLoader
from psycopg_pool import AsyncConnectionPool


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
