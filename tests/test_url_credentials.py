"""Credentials in a server's URL (a password in its userinfo, secret query values) are never stored in clear and
every URL shown or recorded is masked.

Servers are registered with such URLs through the admin's form, `manage.py server add` and the services, on a port
nothing listens on; discovery and a launch fail against each. Then a `pg_dump` of the database, the audit trail
and its exports, every log record (at DEBUG), the pages and the API's JSON are searched for each secret. The
secrets still reach the server: a recording server sees them on the wire.
"""

from __future__ import annotations

import base64
import io
import logging

import pytest
from asgiref.sync import async_to_sync
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from taskhub.accounts.groups import ADMINS, OPERATORS
from taskhub.api.tokens import create_token
from taskhub.audit.models import AuditEvent
from taskhub.mcp.lean import LeanTaskGetter
from taskhub.mcp.secret_urls import mask_url, mask_urls_in, with_secrets
from taskhub.servers.discovery import DiscoveryFailed, discover_and_record
from taskhub.servers.errors import ServerConfigInvalid
from taskhub.servers.models import Server
from taskhub.servers.services import create_server, update_server
from taskhub.tasks import services as task_services
from taskhub.tasks.models import Task
from taskhub.worker import jobs
from tests.account_fixtures import make_user
from tests.catalogue_fixtures import with_tools
from tests.helpers import free_port
from tests.test_audit_pages import body
from tests.test_credentials_nowhere import every_text_logged
from tests.test_models_servers import pg_dump
from tests.threaded_app import ThreadedApp

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "urlpass-5d1c-must-stay-secret"
TOKEN = "urltoken-a7e2-must-stay-secret"
API_KEY = "urlkey-3f9b-must-stay-secret"
SECRETS = (PASSWORD, TOKEN, API_KEY)


def secret_url(port: int, path: str = "mcp") -> str:
    return f"http://robot:{PASSWORD}@127.0.0.1:{port}/{path}?tenant=blue&token={TOKEN}&api_key={API_KEY}"


def test_a_secret_in_a_url_is_stored_encrypted_and_shown_nowhere(caplog, capfd, monkeypatch):
    caplog.set_level(logging.DEBUG)
    admin = make_user("alex", ADMINS)
    operator = make_user("olga", OPERATORS)
    browser = Client()
    browser.force_login(admin)
    pages: list[str] = []
    port = free_port()  # nothing listens there: every call fails

    added = browser.post(
        reverse("servers:add"), {"name": "by-form", "transport": "http", "url": secret_url(port), "enabled": "on"}
    )
    assert added.status_code == 302, added.content.decode()[:2000]
    out = io.StringIO()
    call_command("server", "add", "by-command", "--url", secret_url(port, "cmd"), stdout=out, stderr=io.StringIO())
    pages.append(out.getvalue())
    create_server(name="by-service", transport="http", url=secret_url(port, "svc"), user=admin)

    servers = list(Server.objects.order_by("name"))
    assert [server.name for server in servers] == ["by-command", "by-form", "by-service"]
    for server in servers:
        # Stored without its secrets, which still reach the wire.
        assert server.url.startswith("http://127.0.0.1:") and "token=***" in server.url, server.url
        wire_url = server.to_target().url
        assert f"token={TOKEN}" in wire_url and f"api_key={API_KEY}" in wire_url and "tenant=blue" in wire_url
        assert server.headers["Authorization"] == "Basic " + base64.b64encode(f"robot:{PASSWORD}".encode()).decode()

    with pytest.raises(CommandError) as failed:
        call_command("server", "discover", "by-command", stdout=io.StringIO())
    pages.append(str(failed.value))
    with pytest.raises(DiscoveryFailed) as failed:
        discover_and_record(server=Server.objects.get(name="by-service"))
    pages.append(str(failed.value))
    form_server = Server.objects.get(name="by-form")
    pages.append(browser.post(reverse("servers:discover", args=[form_server.pk]), follow=True).content.decode())
    tasks = []
    for server in Server.objects.all():
        task = task_services.launch(server=with_tools(server, "work"), tool="work", arguments={}, user=operator)
        async_to_sync(jobs.launch)(task.id)
        tasks.append(Task.objects.get(pk=task.id))
    assert all(task.status == "failed" for task in tasks), [(task.status, task.error) for task in tasks]

    async def poll_lean() -> str:
        getter = LeanTaskGetter(form_server.to_target(), timeout=5)
        try:
            await getter.get_task("t-1")
        except Exception as error:
            return str(error)
        finally:
            await getter.aclose()
        raise AssertionError("the poll reached a port nothing listens on")

    pages.append(async_to_sync(poll_lean)())

    for server in Server.objects.all():
        server_pages = [
            browser.get(reverse(f"servers:{name}", args=[server.pk])).content.decode() for name in ("detail", "edit")
        ]
        assert "token=***" in server_pages[0] and "token=***" in server_pages[1]
        pages.extend(server_pages)
    pages.append(browser.get(reverse("servers:list")).content.decode())
    for task in tasks:
        pages.append(browser.get(reverse("tasks:detail", args=[task.pk])).content.decode())
    pages.append(browser.get(reverse("audit:list")).content.decode())
    exports = [body(browser.get(reverse("audit:export", args=[fmt]) + "?made_by=all")) for fmt in ("csv", "json")]
    assert all("server.unreachable" in export for export in exports)
    _, api_secret = create_token(user=admin, name="ci")
    api = Client(headers={"Authorization": f"Bearer {api_secret}"})
    api_json = [api.get("/api/tasks").content.decode()]
    api_json += [api.get(f"/api/tasks/{task.pk}").content.decode() for task in tasks]
    assert all(str(task.pk) in api_json[0] for task in tasks)
    assert any("127.0.0.1" in text for text in api_json[1:]), "the task errors name where the call went"
    out = io.StringIO()
    call_command("server", "list", "--json", stdout=out)
    pages.append(out.getvalue())

    logged = every_text_logged(caplog.records)
    captured = capfd.readouterr()
    logged += captured.out + captured.err
    assert f"127.0.0.1:{port}" in logged, "the failed calls were logged (so the search below saw them)"
    audit = " ".join(repr(event.data) for event in AuditEvent.objects.all())
    stored_errors = " ".join(f"{s.last_error}" for s in Server.objects.all())
    stored_errors += " ".join(f"{t.error} {t.status_message}" for t in Task.objects.all())
    dump = pg_dump()
    assert "tenant=blue" in dump and "server.unreachable" in dump, "the dump holds the servers and the audit trail"
    for where, text in {
        "the database (pg_dump)": dump,
        "an audit row": audit,
        "an audit export": "\n".join(exports),
        "a stored error": stored_errors,
        "a log record": logged,
        "a page or command output": "\n".join(pages),
        "the API": "\n".join(api_json),
    }.items():
        for secret in SECRETS:
            assert secret not in text, f"{secret} in {where}"


def recording_server(seen: list[Request]) -> ThreadedApp:
    async def refuse(request: Request) -> PlainTextResponse:
        seen.append(request)
        return PlainTextResponse("no", status_code=401)

    return ThreadedApp(Starlette(routes=[Route("/mcp", refuse, methods=["GET", "POST", "DELETE"])]))


def test_the_edit_form_keeps_hidden_secrets_and_the_server_still_receives_them():
    admin = make_user("alex", ADMINS)
    browser = Client()
    browser.force_login(admin)
    seen: list[Request] = []
    recorder = recording_server(seen)
    port = recorder.start()
    try:
        server = create_server(name="remote", transport="http", url=secret_url(port), user=admin)
        form = browser.get(reverse("servers:edit", args=[server.pk])).content.decode()
        shown_url = mask_url(secret_url(port)).replace("robot:***@", "")
        assert f'value="{shown_url.replace("&", "&amp;")}"' in form
        saved = browser.post(
            reverse("servers:edit", args=[server.pk]),
            {"name": "remote", "transport": "http", "url": shown_url, "enabled": "on"},
        )
        assert saved.status_code == 302
        server.refresh_from_db()
        assert server.to_target().url == f"http://127.0.0.1:{port}/mcp?tenant=blue&token={TOKEN}&api_key={API_KEY}"
        with pytest.raises(DiscoveryFailed):
            discover_and_record(server=server)
    finally:
        recorder.stop()
    assert seen, "discovery reached the recording server"
    request = seen[0]
    assert request.query_params["token"] == TOKEN and request.query_params["api_key"] == API_KEY
    assert request.headers["authorization"] == "Basic " + base64.b64encode(f"robot:{PASSWORD}".encode()).decode()

    # A new value replaces the stored one; a *** with nothing stored behind it is refused, naming only the parameter.
    update_server(server=server, user=admin, url=f"http://127.0.0.1:{port}/mcp?token=new-value")
    server.refresh_from_db()
    assert server.url_secrets == {"token": ["new-value"]} and "new-value" not in server.url
    with pytest.raises(ServerConfigInvalid, match="api_key"):
        update_server(server=server, user=admin, url=f"http://127.0.0.1:{port}/mcp?api_key=***")
    with pytest.raises(ServerConfigInvalid, match="bearer token"):
        create_server(name="both", transport="http", url=secret_url(port), bearer_token="t", user=admin)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://h.example/mcp", "https://h.example/mcp"),
        ("https://u:p@h.example:8443/mcp", "https://u:***@h.example:8443/mcp"),
        ("https://h.example/mcp?access_token=a&x=1", "https://h.example/mcp?access_token=***&x=1"),
        (
            "https://h.example/mcp?KEY=a&Sig=b&X-Amz-Signature=c",
            "https://h.example/mcp?KEY=***&Sig=***&X-Amz-Signature=***",
        ),
        ("https://h.example/mcp?client_secret=a&password=b", "https://h.example/mcp?client_secret=***&password=***"),
        ("http://[::1]:9/mcp?my_api_token=z", "http://[::1]:9/mcp?my_api_token=***"),
        ("http://[::1", "***"),
        # By rule (issue 31, point 8): any name containing key, token, secret, sig, pass, auth or credential.
        (
            "https://h.example/mcp?access_key=a&subscription-key=b&PRIVATE_KEY=c&auth_key=d&page=2",
            "https://h.example/mcp?access_key=***&subscription-key=***&PRIVATE_KEY=***&auth_key=***&page=2",
        ),
        (
            "https://h.example/mcp?Ocp-Apim-Subscription-Key=a&passphrase=b",
            "https://h.example/mcp?Ocp-Apim-Subscription-Key=***&passphrase=***",
        ),
    ],
)
def test_mask_url(url, shown):
    assert mask_url(url) == shown


def test_urls_in_free_text_are_masked_and_secrets_put_back_in_order():
    text = "ConnectError: 'http://u:pw@h/mcp?token=abc' refused; see https://docs.example/x"
    assert mask_urls_in(text) == "ConnectError: 'http://u:***@h/mcp?token=***' refused; see https://docs.example/x"
    assert with_secrets("https://h/m?key=***&a=1&key=***", {"key": ["1", "2"]}) == "https://h/m?key=1&a=1&key=2"


def test_the_migration_moves_the_secrets_out_of_urls_stored_before():
    from importlib import import_module

    from django.apps import apps

    migration = import_module("taskhub.servers.migrations.0003_url_secrets")
    server = create_server(name="old", transport="http", url="http://127.0.0.1:9/mcp", user=None)
    Server.objects.filter(pk=server.pk).update(url=secret_url(9))  # as a URL was stored before
    migration.secrets_out_of_stored_urls(apps, None)
    server.refresh_from_db()
    assert server.url == "http://127.0.0.1:9/mcp?tenant=blue&token=***&api_key=***"
    assert server.to_target().url == f"http://127.0.0.1:9/mcp?tenant=blue&token={TOKEN}&api_key={API_KEY}"
    assert server.headers["Authorization"] == "Basic " + base64.b64encode(f"robot:{PASSWORD}".encode()).decode()


def test_the_migration_moves_the_values_the_broader_rule_calls_secret_out_of_stored_urls():
    from importlib import import_module

    from django.apps import apps

    migration = import_module("taskhub.servers.migrations.0009_url_secrets_by_rule")
    server = create_server(name="old", transport="http", url=f"http://127.0.0.1:9/mcp?token={TOKEN}", user=None)
    stored = "http://127.0.0.1:9/mcp?token=***&access_key=ak-1&region=eu"  # as the narrower rule left it
    Server.objects.filter(pk=server.pk).update(url=stored)
    migration.secrets_named_by_the_rule_out_of_stored_urls(apps, None)
    server.refresh_from_db()
    assert server.url == "http://127.0.0.1:9/mcp?token=***&access_key=***&region=eu"
    assert server.to_target().url == f"http://127.0.0.1:9/mcp?token={TOKEN}&access_key=ak-1&region=eu"
