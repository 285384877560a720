"""The worker's connector to procrastinate's queue: procrastinate's own worker connector on Django's database
(`app.connector.get_worker_connector()`), with its pooled connections in autocommit and checked by their socket.

As procrastinate makes it, every statement of the worker's (a job's fetch, its finish, a retry) took four round
trips: the pool's check (an empty query), BEGIN, the statement, COMMIT. Each is a single call of one of
procrastinate's functions, atomic by itself, so autocommit runs it alone; and the pool checks a connection with a
query only when its socket is not quiet (taskhub/database/liveness.py). The pickup of an approver's answer (NOTIFY →
the job fetched) lost three round trips of its four (bench/approval.py)."""

from typing import Any

from procrastinate import psycopg_connector
from procrastinate.contrib.django import utils
from procrastinate.contrib.django.settings import settings as procrastinate_settings
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from taskhub.database import liveness


def worker_connector() -> psycopg_connector.PsycopgConnector:
    params = utils.connector_params(procrastinate_settings.DATABASE_ALIAS)
    return psycopg_connector.PsycopgConnector(kwargs=params, pool_factory=_pool, configure=_autocommit)


def _pool(**pool_args: Any) -> AsyncConnectionPool:
    return AsyncConnectionPool(**{**pool_args, "check": liveness.check_pooled})


async def _autocommit(connection: AsyncConnection) -> None:
    # A pool's `configure`, not its connection kwargs: procrastinate opens its LISTEN connection with the pool's
    # kwargs and autocommit=True of its own (a second autocommit is refused), and configures it too.
    await connection.set_autocommit(True)
