"""The Content-Security-Policy header (Django's CSP middleware, settings.SECURE_CSP) on every HTML page.

The browser test (tests/browser/test_csp.py) proves the pages satisfy it; this one that each carries it.
"""

import pytest
from django.test import Client

from tests.csp_fixtures import build_world

pytestmark = pytest.mark.django_db

EXPECTED = {
    "default-src": {"'self'"},
    "script-src": {"'self'"},
    "style-src": {"'self'"},
    "img-src": {"'self'", "data:"},
    "connect-src": {"'self'"},
    "frame-ancestors": {"'none'"},
    "base-uri": {"'self'"},
    "form-action": {"'self'"},
    "object-src": {"'none'"},
}
FORBIDDEN = ("'unsafe-inline'", "'unsafe-eval'", "'unsafe-hashes'", "*")


def parse(header: str) -> dict[str, set[str]]:
    policy = {}
    for part in header.split(";"):
        words = part.split()
        if words:
            policy[words[0]] = set(words[1:])
    return policy


def assert_strict(path: str, response) -> None:
    header = response.headers.get("Content-Security-Policy")
    assert header, f"{path}: no Content-Security-Policy header"
    policy = parse(header)
    for directive, sources in EXPECTED.items():
        assert policy.get(directive) == sources, f"{path}: {directive} is {policy.get(directive)}, not {sources}"
    for directive, sources in policy.items():
        assert not sources & set(FORBIDDEN), f"{path}: {directive} allows {sources & set(FORBIDDEN)}"


def test_every_html_page_carries_the_strict_policy():
    world = build_world(password=None)
    client = Client()
    response = client.get("/accounts/login/")
    assert response.status_code == 200
    assert_strict("/accounts/login/", response)

    client.force_login(world.admin)
    for path in world.pages():
        response = client.get(path)
        assert response.status_code == 200, f"{path}: {response.status_code}"
        assert response["Content-Type"].startswith("text/html"), f"{path}: {response['Content-Type']}"
        assert_strict(path, response)
        body = response.content.decode()
        if not path.startswith(("/admin/", "/api/")):
            # Our own templates: no inline script, no style attributes, no inline handlers.
            assert "<script>" not in body and " style=" not in body and " onclick=" not in body, path


def test_errors_and_refusals_carry_it_too(client):
    for path in ("/no-such-page/", "/tasks/"):
        response = client.get(path)
        assert "Content-Security-Policy" in response.headers, path
