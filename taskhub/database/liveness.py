"""Whether a kept Postgres connection is alive, without a round trip where the socket already says so.

Django's CONN_HEALTH_CHECKS sends `SELECT 1` before the first query of every request, and procrastinate's pool sends
an empty query before every statement of the worker's: about a millisecond each on the 2-core machine, one more
wake-up of Postgres, on every page, every answer and every job (bench/RESULTS.md, session 13). When Postgres ends a
connection (a restart, pg_terminate_backend, idle_session_timeout) it sends its FATAL message and closes the socket,
so the kernel marks the socket readable or hung up; an idle connection that is alive has nothing to read. A quiet
socket is therefore taken as alive, as the query would have found, and anything else (input waiting, a hang-up, a
transaction open) is checked with the query as before. A peer that vanished without closing (a cable cut) is not
seen by either: the query would wait for TCP's timeout too.
"""

import select

from psycopg import AsyncConnection, Connection, pq
from psycopg_pool import AsyncConnectionPool


def quiet(connection: Connection | AsyncConnection) -> bool:
    """True when the connection is open, idle (no transaction), and its socket has nothing to read and no hang-up."""
    if connection.closed or connection.broken:
        return False
    pgconn = connection.pgconn
    if pgconn.transaction_status != pq.TransactionStatus.IDLE:
        return False
    poller = select.poll()
    poller.register(pgconn.socket, select.POLLIN | select.POLLPRI)  # POLLHUP and POLLERR are always reported
    return not poller.poll(0)


async def check_pooled(connection: AsyncConnection) -> None:
    """A psycopg_pool `check`: returns when the connection is alive, raises when not (the pool replaces it)."""
    if not quiet(connection):
        await AsyncConnectionPool.check_connection(connection)
