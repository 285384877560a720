"""Credentials are encrypted at rest and appear nowhere else: not in logs, pages, audit rows or stored errors.

A whole life of servers with credentials, all of it logged at DEBUG: an admin registers them through the
page, discovery fails against a real HTTP server that answers 401 (and, as a careless one would, echoes the
Authorization header and the API key back in its body), a task is launched through the real launch job and
fails the same way, a stdio server with a secret in its environment prints that environment and exits at once,
and people sign in with a password. Then every log record, every page shown, every audit row and every error
stored on the server and the task is searched for each secret.
"""

from __future__ import annotations

import logging
import sys

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test import Client
from django.urls import reverse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from taskhub.accounts.groups import ADMINS, OPERATORS
from taskhub.api.models import ApiToken
from taskhub.api.tokens import create_token
from taskhub.audit.models import AuditEvent
from taskhub.servers.models import Server
from taskhub.tasks import services
from taskhub.tasks.models import Task
from taskhub.worker import jobs
from tests.account_fixtures import make_user
from tests.catalogue_fixtures import with_tools
from tests.threaded_app import ThreadedApp

pytestmark = pytest.mark.django_db(transaction=True)

BEARER = "bearer-4c1e-must-stay-secret"
HEADER_SECRET = "apikey-9b2d-must-stay-secret"
ENV_SECRET = "envvalue-77aa-must-stay-secret"
PASSWORD = "password-e3f0-must-stay-secret"


def echoing_401_server() -> ThreadedApp:
    """Refuses everything with 401, quoting the credentials it was sent (a careless server's error page)."""

    async def refuse(request: Request) -> PlainTextResponse:
        echoed = f"Unauthorized: {request.headers.get('authorization')} / key {request.headers.get('x-api-key')}"
        return PlainTextResponse(echoed, status_code=401, headers={"WWW-Authenticate": 'Bearer realm="x"'})

    return ThreadedApp(Starlette(routes=[Route("/mcp", refuse, methods=["GET", "POST", "DELETE"])]))


def every_text_logged(records: list[logging.LogRecord]) -> str:
    texts = []
    for record in records:
        texts.append(record.getMessage())
        if record.exc_info:
            texts.append(logging.Formatter().formatException(record.exc_info))
        texts.append(repr(record.__dict__))
    return "\n".join(texts)


def discover(browser: Client, server: Server, admin) -> str:
    """“Discover now”, the job a worker would run, and the page's poll of the outcome."""
    browser.post(reverse("servers:discover", args=[server.pk]))
    async_to_sync(jobs.discover_server.func)(server_id=server.pk, requested_by=admin.pk)
    return browser.get(reverse("servers:discovery", args=[server.pk])).content.decode()


def test_no_credential_in_logs_pages_audit_or_errors(caplog, capfd):
    caplog.set_level(logging.DEBUG)
    admin = make_user("alex", ADMINS)
    operator = make_user("olga", OPERATORS, password=PASSWORD)
    browser = Client()
    browser.force_login(admin)
    refusing = echoing_401_server()
    port = refusing.start()
    pages: list[str] = []
    try:
        added = browser.post(
            reverse("servers:add"),
            {
                "name": "careless",
                "transport": "http",
                "url": f"http://127.0.0.1:{port}/mcp",
                "enabled": "on",
                "bearer_token": BEARER,
                "headers": f"X-Api-Key: {HEADER_SECRET}",
            },
        )
        assert added.status_code == 302
        server = Server.objects.get(name="careless")
        pages.append(discover(browser, server, admin))
        assert "401" in pages[-1]

        task = services.launch(server=with_tools(server, "work"), tool="work", arguments={"x": 1}, user=operator)
        async_to_sync(jobs.launch)(task.id)
    finally:
        refusing.stop()

    stdio = browser.post(
        reverse("servers:add"),
        {
            "name": "local",
            "transport": "stdio",
            "command": sys.executable,
            # A careless server's debug output: its whole environment on stderr, then it exits.
            "args": "-c\nimport os, sys; print(dict(os.environ), file=sys.stderr); raise SystemExit(3)",
            "env": f"TOKEN={ENV_SECRET}",
        },
    )
    assert stdio.status_code == 302
    local = Server.objects.get(name="local")
    pages.append(discover(browser, local, admin))
    local.refresh_from_db()
    assert local.last_error
    sign_in = Client()
    sign_in.post(reverse("accounts:login"), {"username": "olga", "password": PASSWORD + "-wrong"})
    assert sign_in.post(reverse("accounts:login"), {"username": "olga", "password": PASSWORD}).status_code == 302
    _, api_secret = create_token(user=admin, name="ci")

    server.refresh_from_db()
    task = Task.objects.get(pk=task.pk)
    assert server.last_error and task.status == "failed", (server.last_error, task.status, task.error)
    for name in ("detail", "edit"):
        for shown in Server.objects.all():
            pages.append(browser.get(reverse(f"servers:{name}", args=[shown.pk])).content.decode())
    pages.append(browser.get(reverse("servers:list")).content.decode())
    pages.append(browser.get(reverse("tasks:detail", args=[task.pk])).content.decode())
    pages.append(browser.get(reverse("audit:list")).content.decode())

    stored_errors = f"{server.last_error} {local.last_error} {task.error} {task.status_message}"
    audit = " ".join(repr(event.data) for event in AuditEvent.objects.all())
    captured = capfd.readouterr()
    # And what this process wrote to its own stdout and stderr.
    logged = every_text_logged(caplog.records) + captured.out + captured.err
    # A target written into a log line or a traceback (repr) shows where, never with what.
    targets = " ".join(f"{server.to_target()!r} {server.to_target()}" for server in Server.objects.all())
    with connection.cursor() as cursor:
        cursor.execute("SELECT bearer_token, headers::text, env::text FROM servers_server")
        at_rest = repr(cursor.fetchall())
        cursor.execute("SELECT password FROM auth_user WHERE username = 'olga'")
        at_rest += repr(cursor.fetchall())
        cursor.execute(f"SELECT * FROM {ApiToken._meta.db_table}")
        at_rest += repr(cursor.fetchall())

    secrets = (BEARER, HEADER_SECRET, ENV_SECRET, PASSWORD, api_secret)
    for where, text in {
        "a stored error": stored_errors,
        "an audit row": audit,
        "a log record": logged,
        "a target's repr": targets,
        "a page": "\n".join(pages),
        "a database column": at_rest,
    }.items():
        for secret in secrets:
            assert secret not in text, f"{secret} in {where}"
    assert "401 Unauthorized" in logged, "the refused discovery was logged (so the search above saw the run)"
    assert "'TOKEN': '[redacted]'" in logged, "the stdio server's stderr was logged (redacted)"
