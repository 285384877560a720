"""The whole product in real processes for end-to-end tests: the demo MCP server, `manage.py worker`, daphne.

The web and worker processes share live updates through the real Redis channel layer (as in production),
under a channel prefix of their own so that concurrent test runs on one Redis never hear each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.cookiejar import CookieJar
from pathlib import Path
from urllib.parse import urlencode

import aiohttp
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections
from django.db.models import Q
from django.test import Client
from django.utils import timezone
from procrastinate.contrib.django import app
from procrastinate.contrib.django.models import ProcrastinateJob

from taskhub.servers.discovery import discover_and_record
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks.models import Task
from taskhub.worker.connector import worker_connector
from tests.browser_fixtures import DaphneServer, database_url_for_subprocesses, running_daphne
from tests.demo_process import PROJECT_ROOT, DemoServer

LOCAL_REDIS_URL = os.environ.get("TASKHUB_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
def empty_job_queue():
    """No procrastinate job left by an earlier test of this database. procrastinate's tables are not Django-managed,
    so the flush after a transactional test leaves its jobs behind (a worker would run them, /metrics would count
    them). In a test that runs in a transaction the delete is rolled back with it."""
    with connections["default"].cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_periodic_defers; DELETE FROM procrastinate_jobs")


def due_jobs() -> int:
    """procrastinate jobs waiting to run now (not those scheduled later)."""
    todo = ProcrastinateJob.objects.filter(status="todo")
    return todo.filter(Q(scheduled_at__isnull=True) | Q(scheduled_at__lte=timezone.now())).count()


async def run_worker_until_idle(timeout: float = 30, concurrency: int = 4) -> None:
    """A real procrastinate worker, on its own connector as in production, until no job is due.

    With wait=False a worker stops at the first empty fetch, even while a running job defers the next
    one; so it runs again as long as jobs are due.
    """
    async with asyncio.timeout(timeout):
        with app.replace_connector(worker_connector()) as worker_app:
            async with worker_app.open_async():
                while True:
                    await worker_app.run_worker_async(
                        wait=False, concurrency=concurrency, install_signal_handlers=False, listen_notify=False
                    )
                    if not await sync_to_async(due_jobs)():
                        return


def worker_log(name: str) -> Path:
    """Where the worker `name` started by Workers writes its output: per pytest-xdist process, as test modules running
    at once on other processes start workers of the same names (a test read "east"'s log while another module's
    "east" had just started it afresh)."""
    runner = os.environ.get("PYTEST_XDIST_WORKER")
    return PROJECT_ROOT / "test-output" / (f"worker-{name}-{runner}.log" if runner else f"worker-{name}.log")


class Workers:
    """`manage.py worker` processes, stopped at the end of the test whatever happens."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.processes: dict[str, subprocess.Popen] = {}

    def start(self, name: str, *options: str) -> subprocess.Popen:
        command = [sys.executable, "manage.py", "worker", "--name", name, "--lease-seconds", "4", *options]
        path = worker_log(name)
        path.parent.mkdir(exist_ok=True)
        log = open(path, "w")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(command, cwd=PROJECT_ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.processes[name] = process
        return process

    def stop_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def demo_stats(demo: DemoServer) -> dict:
    """The demo server's request counters (GET /demo/stats): polls, deliveries and cancels per task."""
    with urllib.request.urlopen(f"http://127.0.0.1:{demo.port}/demo/stats", timeout=5) as response:
        return json.load(response)


def statuses(tasks) -> dict[str, int]:
    """How many of `tasks` are in each status now."""
    counts: dict[str, int] = {}
    for status in Task.objects.filter(pk__in=[t.pk for t in tasks]).values_list("status", flat=True):
        counts[status] = counts.get(status, 0) + 1
    return counts


def worker_environment(**extra: str) -> dict[str, str]:
    """Environment for worker subprocesses, on the very test database this test uses."""
    env = dict(os.environ)
    env.update(DATABASE_URL=database_url_for_subprocesses(), DEBUG="true", PYTHONUNBUFFERED="1")
    env.update(extra)
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    return env


def production_environment(static_root, **overrides: str) -> dict[str, str]:
    """The environment of a production deployment as the README documents it (DEBUG off, a SECRET_KEY, static
    files collected into `static_root`, Redis), for daphne and worker subprocesses; collectstatic has run."""
    env = {
        "DJANGO_SETTINGS_MODULE": "taskhub.settings",
        "DEBUG": "false",
        "SECRET_KEY": "production-test-" + uuid.uuid4().hex,
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "HTTPS_ONLY": "false",  # plain HTTP between the test and daphne; HTTPS is the proxy's job
        "STATIC_ROOT": str(static_root),
        "REDIS_URL": LOCAL_REDIS_URL,
        "REDIS_CHANNEL_PREFIX": f"taskhub-prod-test-{uuid.uuid4().hex[:8]}",
        "LOG_FORMAT": "json",
        **overrides,
    }
    collect = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput"],
        cwd=PROJECT_ROOT,
        env={**worker_environment(), **env},
        capture_output=True,
        text=True,
    )
    assert collect.returncode == 0, collect.stderr
    return env


def register_and_discover(demo: DemoServer, user, **options) -> Server:
    server = create_server(name=options.pop("name", f"demo-{demo.port}"), transport="http", url=demo.url, user=user)
    in_own_thread(discover_and_record, server=server, user=user)
    server.refresh_from_db()
    return server


def in_own_thread(function, **kwargs):
    """Run sync code that may use async_to_sync on a thread of its own: Playwright keeps an event loop
    running in the test's thread. The thread's database connection is closed, or the test database could
    not be dropped at the end."""

    def call():
        try:
            return function(**kwargs)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result()


def session_cookie_for(user) -> str:
    """The session cookie of a signed-in `user`, for clients that are not a browser (e.g. a bare WebSocket)."""
    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


RUNNING_COUNT = 'aria-label="running tasks">'


def running_counts(frames: list[str]) -> list[str]:
    """The nav's count of running tasks in each frame of the live socket that carries it."""
    return [frame.split(RUNNING_COUNT, 1)[1].split("<", 1)[0] for frame in frames if RUNNING_COUNT in frame]


def went_up_and_down(frames: list[str]) -> bool:
    counts = running_counts(frames)
    return "1" in counts and counts[-1] == "0" and counts.index("1") < len(counts) - 1


async def frames_until(url: str, cookie: str, done, *, timeout: float) -> list[str]:
    """Frames of the live socket at `url` (as the signed-in user of `cookie`) until `done(frames)` or `timeout`."""
    frames: list[str] = []
    async with (
        aiohttp.ClientSession(cookies={settings.SESSION_COOKIE_NAME: cookie}) as session,
        session.ws_connect(url, origin=url.replace("ws://", "http://").removesuffix("/ws/live/")) as socket,
    ):
        async with asyncio.timeout(timeout):
            async for message in socket:
                frames.append(message.data)
                if done(frames):
                    return frames
    return frames


@dataclass
class LiveStack:
    demo: DemoServer
    server: Server
    web: DaphneServer
    workers: Workers

    @property
    def url(self) -> str:
        return self.web.url


@contextlib.contextmanager
def running_stack(admin, *demo_options: str) -> Iterator[LiveStack]:
    """Demo server (with the hostile tool) registered and discovered, one worker, one daphne, on Redis."""
    redis = {"REDIS_URL": LOCAL_REDIS_URL, "REDIS_CHANNEL_PREFIX": f"taskhub-test-{uuid.uuid4().hex[:12]}"}
    with DemoServer("--hostile", "--poll-interval-ms", "200", *demo_options) as demo:
        server = register_and_discover(demo, admin)
        workers = Workers(worker_environment(**redis))
        try:
            workers.start(f"stack-{demo.port}")
            with running_daphne(**redis) as web:
                yield LiveStack(demo=demo, server=server, web=web, workers=workers)
        finally:
            workers.stop_all()


@pytest.fixture
def workers(django_db_setup) -> Iterator[Workers]:
    pool = Workers(worker_environment())
    yield pool
    pool.stop_all()


# The heartbeat and settle times tests/settings.py shortens for every test; without them a worker has production's.
SHORTENED_RECOVERY_TIMES = (
    "TASKHUB_WORKER_HEARTBEAT_SECONDS",
    "TASKHUB_STALLED_WORKER_SECONDS",
    "TASKHUB_DELIVERY_TIMEOUT_SECONDS",
    "TASKHUB_DELIVERY_SETTLE_SECONDS",
    "TASKHUB_DEAD_WORKER_GRACE_SECONDS",
)


@pytest.fixture
def production_timed_workers(django_db_setup) -> Iterator[Workers]:
    """Workers that beat, find each other dead and let cut-off deliveries settle as in production (the defaults of
    taskhub/settings.py): for the recovery-time tests."""
    env = worker_environment(DJANGO_SETTINGS_MODULE="taskhub.settings")  # tests.settings would shorten them again
    for name in SHORTENED_RECOVERY_TIMES:
        env.pop(name, None)
    pool = Workers(env)
    yield pool
    pool.stop_all()


class SignedIn:
    """A person signed in through the sign-in form over plain HTTP: cookies and CSRF token, no browser."""

    def __init__(self, base: str, username: str, password: str) -> None:
        self.base = base
        self.jar = CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))
        self.opener.open(f"{base}/accounts/login/", timeout=15).read()
        landed = self.post("/accounts/login/", {"username": username, "password": password})
        assert landed.url.rstrip("/") == base, f"sign-in did not go through: {landed.url}"

    def get(self, path: str) -> str:
        """The page's text; an HTTP error status raises."""
        with self.opener.open(f"{self.base}{path}", timeout=15) as response:
            return response.read().decode()

    def post(self, path: str, data: dict[str, str]):
        """A form POST with the CSRF token, following the redirect; the final response (with .url and .status)."""
        csrf = next(cookie.value for cookie in self.jar if cookie.name == "csrftoken")
        form = urlencode({**data, "csrfmiddlewaretoken": csrf}).encode()
        request = urllib.request.Request(f"{self.base}{path}", data=form, headers={"Referer": f"{self.base}{path}"})
        with self.opener.open(request, timeout=15) as response:
            response.read()
            return response


def api_request(method: str, url: str, token: str, body=None) -> tuple[int, dict]:
    """One JSON API call with a bearer token: the status and the decoded body (errors included)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)
