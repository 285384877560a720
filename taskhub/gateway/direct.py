"""`tasks/get` answered beside Django's handler: the agent's poll, the gateway's most frequent request.

Through Django, one `tasks/get` cost daphne about 3.8 ms of CPU (bench/gateway.py: 250 a second on one daphne, where
the demo server's own endpoint answers 1,745): the ASGI request, the thread hand-off and the middleware chain about
1.6 ms, the two ORM reads (the token with its user, the task with its server) about 1.5, most of it compiling their
SQL. Daphne itself spends 0.3. Here the same answer is one statement, prepared on the server, on a connection of a
small asyncio pool of the process's own, read on the event loop (no thread), and the headers Django's middleware
would have added (bench/RESULTS.md, issue 37 item 1).

Only the plain case is answered here: a well-formed `tasks/get` without a cookie or a language, to a host Django
accepts, over HTTPS when Django insists, with a token that is valid, of an active user, used in the last minute (the
use is stamped by Django's path), for one of the user's own tasks that is not waiting on input (that answer needs the
open requests and the tool's policy). Everything else returns None and goes through Django as before, which answers
each refusal and each error as it always did, and so does a fault of this path or of its database connection. What
this module answers is what Django's path answers, byte for byte but the Date (tests/test_gateway_direct.py sends
every kind of request both ways and compares).
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import NamedTuple

import psycopg
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.core.serializers.json import DjangoJSONEncoder
from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.dispatch import receiver
from django.urls import Resolver404, resolve
from django.utils import timezone
from django.utils.csp import CSP, build_policy
from procrastinate.contrib.django.utils import connector_params
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from taskhub.api.tokens import LAST_USED_RESOLUTION, TOKEN_PREFIX, key_hash_of
from taskhub.database import liveness, pooled
from taskhub.gateway import views, wire_tasks
from taskhub.gateway.protocol import MAX_BODY_BYTES, RpcError, check_headers, check_meta, parse_call, result_message
from taskhub.observability import metrics
from taskhub.tasks import raw_rows
from taskhub.tasks.models import Task, TaskStatus
from taskhub.web import machine_input
from taskhub.web.request_threads import ANSWERED_AT_ONCE_URLCONF

logger = logging.getLogger(__name__)

METHOD = b"tasks/get"
# How long a poll waits for one of the pool's connections before Django's path answers it instead.
POOL_WAIT_SECONDS = 1.0
# Statuses whose answer reads more than the task's row: the open requests, the tool's approval policy.
NEEDS_MORE_THAN_THE_ROW = frozenset({TaskStatus.LAUNCHING, TaskStatus.INPUT_REQUIRED})


@dataclass(frozen=True)
class DirectAnswer:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


def _statement(aggregate: bool) -> str:
    server = "" if aggregate else ' AND s."name" = %s'
    return (
        f"SELECT {', '.join(raw_rows.columns('t', Task, wire_tasks.DETAILED_TASK_FIELDS))}, "
        'k."expires_at", k."last_used_at" '
        'FROM "tasks_task" t '
        'JOIN "api_apitoken" k ON k."user_id" = t."launched_by_id" '
        'JOIN "auth_user" u ON u."id" = k."user_id" '
        'JOIN "servers_server" s ON s."id" = t."server_id" '
        f'WHERE t."id" = %s AND k."key_hash" = %s AND k."revoked_at" IS NULL AND u."is_active"{server}'
    )


STATEMENTS = {True: _statement(aggregate=True), False: _statement(aggregate=False)}


class Route(NamedTuple):
    """Where a gateway path goes, as Django resolves it: the aggregate endpoint or one server's, and the view's name
    (the label Django's request metrics give it)."""

    aggregate: bool
    server_name: str | None
    view_label: str


@functools.lru_cache(maxsize=1024)
def route(path: str) -> Route | None:
    try:
        match = resolve(path, urlconf=ANSWERED_AT_ONCE_URLCONF)
    except Resolver404:
        return None
    if match.func is views.aggregate_endpoint_at_once:
        return Route(True, None, match.view_name)
    if match.func is views.server_endpoint_at_once:
        return Route(False, match.kwargs["name"], match.view_name)
    return None


async def answer_tasks_get(scope, body: bytes) -> DirectAnswer | None:
    """The answer to this `tasks/get`, or None when Django's path must answer it (the module's docstring), read on
    the event loop from a connection of the process's own small pool (no thread, no hand-off)."""
    started = time.perf_counter()
    try:
        asked = plain_tasks_get(scope, body)
        if asked is None:
            return None
        try:
            row = await _fetch_one(STATEMENTS[asked.aggregate], asked.params)
        except (DatabaseError, PoolTimeout):
            return None  # Django's path meets the same trouble and answers it as it does
        answer = _answer(asked, row)
    except Exception:
        # A fault of this path, never the agent's: Django's path answers, and the fault is logged to be mended.
        logger.exception("gateway: the direct tasks/get failed; Django's path answers it")
        return None
    if answer is not None:
        metrics.http_request("POST", asked.view_label, answer.status, time.perf_counter() - started)
    return answer


@dataclass(frozen=True)
class PlainGet:
    """A plain `tasks/get`: its id, the statement's parameters, whether it came over HTTPS, and its view's label."""

    call_id: str | int
    aggregate: bool
    params: tuple
    secure: bool
    view_label: str


def plain_tasks_get(scope, body: bytes) -> PlainGet | None:
    if scope.get("method") != "POST":
        return None
    # Django's own request on the scope (its headers, host and scheme as every view reads them); no middleware.
    try:
        request = ASGIRequest(scope, io.BytesIO(body))
    except UnicodeDecodeError:
        return None  # Django's handler answers 400
    endpoint = route(request.path_info)
    if endpoint is None:
        return None
    aggregate, server_name, view_label = endpoint
    if server_name is not None and machine_input.unstorable(server_name):
        return None  # refused by Django's middleware (json_errors_for_machines)
    if settings.DISALLOWED_USER_AGENTS or settings.PREPEND_WWW:
        return None  # CommonMiddleware's, when a deployment sets them
    headers = request.headers
    # A person's language (their cookie's session, their browser's) would change the answer's headers.
    if "cookie" in headers or "accept-language" in headers:
        return None
    try:
        request.get_host()
    except DisallowedHost:
        return None
    secure = request.is_secure()
    if settings.SECURE_SSL_REDIRECT and not secure:
        return None
    scheme, _, secret = headers.get("authorization", "").partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret.startswith(TOKEN_PREFIX) or len(secret) > 200:
        return None
    if len(body) > MAX_BODY_BYTES or machine_input.MAY_DECODE_UNSTORABLE.search(body):
        return None
    try:
        call = parse_call(body)
        if call.method != "tasks/get" or call.is_notification:
            return None
        check_headers(call, headers)
        check_meta(call)
    except RpcError:
        return None
    task_id = call.params.get("taskId")
    if not call.declares_tasks or not isinstance(task_id, str):
        return None
    try:
        pk = uuid.UUID(task_id)
    except ValueError:
        return None
    params = (pk, key_hash_of(secret)) if aggregate else (pk, key_hash_of(secret), server_name)
    return PlainGet(call_id=call.id, aggregate=aggregate, params=params, secure=secure, view_label=view_label)


def _answer(asked: PlainGet, row) -> DirectAnswer | None:
    if row is None:
        return None
    *task_columns, expires_at, last_used_at = row
    now = timezone.now()
    if expires_at is not None and expires_at <= now:
        return None
    if last_used_at is None or now - last_used_at > LAST_USED_RESOLUTION:
        return None  # Django's path stamps it
    (task,) = raw_rows.instances(task_columns, (Task,), using=_django_side(), only=wire_tasks.DETAILED_TASK_FIELDS)
    if task.status in NEEDS_MORE_THAN_THE_ROW:
        return None
    message = result_message(asked.call_id, wire_tasks.detailed_task(task))
    body = json.dumps(message, cls=DjangoJSONEncoder).encode()
    headers = [*_fixed_headers(asked.secure), (b"Content-Length", str(len(body)).encode())]
    return DirectAnswer(200, headers, body)


# Connections of the direct reads, per process (per event loop): few, as a poll holds one only for its statement.
POOL_SIZE = 2
POOL_NAME = "taskhub-gateway-direct"  # its connections' application_name in pg_stat_activity
PREPARE_THRESHOLD = 5  # psycopg's default; the direct statement asks to be prepared at once (prepare=True)
_pools: dict[asyncio.AbstractEventLoop, asyncio.Future] = {}


@functools.cache
def _django_side():
    """A DatabaseWrapper of the default database kept for the process, never connected: the converters, the time
    zone and the error wrapping of the direct reads. Django's own `connection` is one per asyncio context: under
    daphne a new wrapper (and its introspection, features, operations) for every request that touches it."""
    return connections.create_connection(DEFAULT_DB_ALIAS)


async def _fetch_one(statement: str, params: tuple):
    """The statement's one row, prepared on the server (once per connection: Django binds on the client, and Postgres
    would parse and plan the four joins on every poll). Errors are Django's, as the ORM raises them."""
    pool = await _pool()
    metrics.database_statement()
    with _django_side().wrap_database_errors:
        async with pool.connection() as connection:
            cursor = await connection.execute(statement, params, prepare=True)
            return await cursor.fetchone()


async def _pool() -> AsyncConnectionPool:
    loop = asyncio.get_running_loop()
    opened = _pools.get(loop)
    if opened is None:
        opened = _pools[loop] = loop.create_future()
        pool = AsyncConnectionPool(
            # Django turns psycopg's prepared statements off (prepare_threshold None); this one statement is prepared.
            kwargs={**connector_params(), "prepare_threshold": PREPARE_THRESHOLD, "application_name": POOL_NAME},
            min_size=1,
            max_size=POOL_SIZE,
            timeout=POOL_WAIT_SECONDS,
            open=False,
            check=liveness.check_pooled,
            configure=_read_as_django_does,
            name=POOL_NAME,
        )
        try:
            await pool.open()
        except BaseException as error:
            del _pools[loop]
            opened.set_exception(error)
            opened.exception()  # retrieved: it is raised here, and to each poll that awaited the opening
            raise
        opened.set_result(pool)
    return await asyncio.shield(opened)


async def close_pools() -> None:
    """Close this event loop's pool (tests: its connections keep the test database from being dropped)."""
    opened = _pools.pop(asyncio.get_running_loop(), None)
    if opened is not None and opened.done() and opened.exception() is None:
        await opened.result().close()


async def _read_as_django_does(connection: psycopg.AsyncConnection) -> None:
    await connection.set_autocommit(True)
    pooled.read_as_django_does(connection, timezone=_django_side().timezone)


@functools.cache
def _fixed_headers(secure: bool) -> tuple[tuple[bytes, bytes], ...]:
    """What taskhub's middleware adds to the gateway's JSON answer to a request without a cookie or Accept-Language
    (settings.MIDDLEWARE: security, locale, session, clickjacking, CSP), as it adds them."""
    headers = {"Content-Type": "application/json"}
    if settings.SECURE_HSTS_SECONDS and secure:
        hsts = f"max-age={settings.SECURE_HSTS_SECONDS}"
        hsts += "; includeSubDomains" if settings.SECURE_HSTS_INCLUDE_SUBDOMAINS else ""
        hsts += "; preload" if settings.SECURE_HSTS_PRELOAD else ""
        headers["Strict-Transport-Security"] = hsts
    if settings.SECURE_CONTENT_TYPE_NOSNIFF:
        headers["X-Content-Type-Options"] = "nosniff"
    if policy := settings.SECURE_REFERRER_POLICY:
        parts = policy.split(",") if isinstance(policy, str) else policy
        headers["Referrer-Policy"] = ",".join(part.strip() for part in parts)
    if settings.SECURE_CROSS_ORIGIN_OPENER_POLICY:
        headers["Cross-Origin-Opener-Policy"] = settings.SECURE_CROSS_ORIGIN_OPENER_POLICY
    headers["Vary"] = "Accept-Language, Cookie"
    headers["Content-Language"] = settings.LANGUAGE_CODE
    headers["X-Frame-Options"] = settings.X_FRAME_OPTIONS.upper()
    for header, config in [
        (CSP.HEADER_ENFORCE, settings.SECURE_CSP),
        (CSP.HEADER_REPORT_ONLY, settings.SECURE_CSP_REPORT_ONLY),
    ]:
        if config:
            headers[str(header)] = build_policy(config, None)
    return tuple((name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items())


@receiver(setting_changed)
def _settings_changed(**kwargs) -> None:
    _fixed_headers.cache_clear()
