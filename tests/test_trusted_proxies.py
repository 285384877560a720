"""The client's address comes from forwarding headers only when the direct peer is a trusted proxy (issue 31, point 2).

Through the ASGI application as daphne calls it: the scope's client is what Django's REMOTE_ADDR, the sign-in limit,
/metrics' networks and the live socket read. tests/test_login_concurrency.py sends 60 sign-ins with a forged
X-Forwarded-For each through a real daphne run as in production.
"""

import re

import pytest
from asgiref.testing import ApplicationCommunicator
from django.core.exceptions import ImproperlyConfigured
from django.core.handlers.asgi import ASGIHandler

from taskhub.settings import trusted_proxies_from_env
from taskhub.web.proxies import behind_trusted_proxies
from tests.metrics_fixtures import ROOT


def scope(peer: str, forwarded_for: str | None = None, *, path: str = "/", kind: str = "http") -> dict:
    headers = [(b"host", b"testserver")] + ([(b"x-forwarded-for", forwarded_for.encode())] if forwarded_for else [])
    return {
        "type": kind,
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": (peer, 50000),
        "server": ("testserver", 80),
    }


async def client_seen(application, request_scope: dict) -> str:
    seen = {}

    async def recorder(inner_scope, receive, send):
        seen["client"] = inner_scope["client"][0]

    await behind_trusted_proxies(recorder, application)(request_scope, None, None)
    return seen["client"]


@pytest.mark.parametrize(
    ("proxies", "peer", "forwarded_for", "client"),
    [
        ([], "203.0.113.7", "10.9.9.9", "203.0.113.7"),  # no proxy trusted: the header is ignored
        (["10.0.0.0/8"], "198.51.100.1", "10.9.9.9", "198.51.100.1"),  # not from a trusted proxy: ignored
        (["10.0.0.5"], "10.0.0.5", "203.0.113.7", "203.0.113.7"),  # from the proxy: the client it saw
        # What a client wrote stands left of what the proxy appends: the rightmost untrusted address counts.
        (["10.0.0.5"], "10.0.0.5", "10.9.9.9, 203.0.113.7", "203.0.113.7"),
        (["10.0.0.0/8"], "10.0.0.5", "192.0.2.1, 203.0.113.7, 10.0.0.6", "203.0.113.7"),  # two proxies in a row
        (["::1"], "::1", "2001:db8::7", "2001:db8::7"),
    ],
)
async def test_the_client_is_taken_from_x_forwarded_for_only_behind_a_trusted_proxy(
    proxies, peer, forwarded_for, client
):
    assert await client_seen(proxies, scope(peer, forwarded_for)) == client
    assert await client_seen(proxies, scope(peer, forwarded_for, kind="websocket")) == client


@pytest.mark.django_db(transaction=True)
async def test_metrics_networks_judge_the_address_the_trusted_proxy_forwards(settings):
    settings.TASKHUB_METRICS_TOKEN = ""
    settings.TASKHUB_METRICS_ALLOWED_NETWORKS = ["10.0.0.0/8"]
    settings.ALLOWED_HOSTS = ["testserver"]
    django_app = behind_trusted_proxies(ASGIHandler(), ["192.0.2.10"])

    async def status(peer: str, forwarded_for: str | None) -> int:
        communicator = ApplicationCommunicator(django_app, scope(peer, forwarded_for, path="/metrics"))
        await communicator.send_input({"type": "http.request", "body": b""})
        start = await communicator.receive_output(10)
        await communicator.wait(10)
        return start["status"]

    assert await status("203.0.113.7", "10.9.9.9") == 403  # a forged header from anyone: refused, as measured
    assert await status("192.0.2.10", "10.9.9.9, 203.0.113.7") == 403  # the client is the proxy's peer, outside
    assert await status("192.0.2.10", "10.9.9.9") == 200  # the proxy's client, inside the network


@pytest.mark.parametrize("entry", ["*", "proxy.internal", "10.0.0.0/33"])
def test_a_trusted_proxy_is_named_by_its_address_or_network_only(monkeypatch, entry):
    monkeypatch.setenv("TASKHUB_TRUSTED_PROXIES", f"10.0.0.5, {entry}")
    with pytest.raises(ImproperlyConfigured, match="is not an IP address or network"):
        trusted_proxies_from_env("TASKHUB_TRUSTED_PROXIES")
    monkeypatch.setenv("TASKHUB_TRUSTED_PROXIES", "10.0.0.5, 10.1.0.0/16, ::1")
    assert trusted_proxies_from_env("TASKHUB_TRUSTED_PROXIES") == ["10.0.0.5/32", "10.1.0.0/16", "::1/128"]


def test_no_production_command_runs_daphne_with_its_own_proxy_headers():
    for path in ("Dockerfile", "README.md", "compose.yaml"):
        assert not re.search(r"daphne[^\n`]*--proxy-headers", (ROOT / path).read_text()), path
