"""Single sign-on through a real OpenID Connect provider (issue 35, item 1): django-oauth-toolkit's, in its own Django
project (tests/oidc_provider) served by `runserver` in a process of its own, and taskhub under daphne configured for it
with local passwords off. A person signs in through the browser: their provider groups map to roles; removed from a
group at the provider, they lose the role at their next request (their expired access token refreshed to ask) and their
open page's live socket closes; the sign-in page has no password form, and a password POSTed to it is refused."""

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from taskhub.accounts.groups import ADMINS, APPROVERS, OPERATORS
from taskhub.audit.models import AuditEvent
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.browser_fixtures import PROJECT_DIR, daphne_process, database_url_for_subprocesses, needs_redis, screenshot

pytestmark = pytest.mark.slow

PROVIDER_NAME = "Example IdP"
CLIENT_ID, CLIENT_SECRET = "taskhub-test", "a test client secret"
ADA_PASSWORD = "ada's provider password"


@dataclass
class SsoServers:
    taskhub: str
    issuer: str
    provider_env: dict[str, str]

    def provider(self, *args: str) -> None:
        """`python -m tests.oidc_provider ARGS` on the provider's database, as its admin would change it."""
        subprocess.run(
            [sys.executable, "-m", "tests.oidc_provider", *args], env=self.provider_env, cwd=PROJECT_DIR, check=True
        )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for(url: str, process: subprocess.Popen, log) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the provider exited with {process.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"the provider did not answer within 60 s:\n{log.read_text()}")


@pytest.fixture(scope="module")
def sso(django_db_setup, django_db_blocker, live_channel_env, tmp_path_factory) -> Iterator[SsoServers]:
    needs_redis(live_channel_env)
    provider_port, taskhub_port = _free_port(), _free_port()
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    provider_env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.oidc_provider.settings",
        "OIDC_TEST_DATABASE": str(tmp_path_factory.mktemp("oidc-provider") / "provider.sqlite3"),
        "OIDC_TEST_RSA_KEY": pem.decode(),
        "PYTHONUNBUFFERED": "1",
    }
    taskhub = f"http://127.0.0.1:{taskhub_port}"
    servers = SsoServers(taskhub, f"http://127.0.0.1:{provider_port}/o", provider_env)
    servers.provider(
        "setup",
        f"{taskhub}/accounts/sso/callback/",
        CLIENT_ID,
        CLIENT_SECRET,
        f"ada:{ADA_PASSWORD}:idp-ops,idp-approvers",
    )
    log = PROJECT_DIR / "test-output" / f"oidc-provider-{provider_port}.log"
    log.parent.mkdir(exist_ok=True)
    with open(log, "w") as out:
        provider = subprocess.Popen(
            [sys.executable, "-m", "django", "runserver", f"127.0.0.1:{provider_port}", "--noreload"],
            env=provider_env,
            cwd=PROJECT_DIR,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        with django_db_blocker.unblock():
            database_url = database_url_for_subprocesses()
        env = {
            **os.environ,
            **live_channel_env,
            "DATABASE_URL": database_url,
            "DJANGO_SETTINGS_MODULE": "taskhub.settings",
            "DEBUG": "true",
            "PYTHONUNBUFFERED": "1",
            "TASKHUB_OIDC_ISSUER": servers.issuer,
            "TASKHUB_OIDC_CLIENT_ID": CLIENT_ID,
            "TASKHUB_OIDC_CLIENT_SECRET": CLIENT_SECRET,
            "TASKHUB_OIDC_PROVIDER_NAME": PROVIDER_NAME,
            "TASKHUB_OIDC_GROUP_ROLES": "idp-ops=operators,idp-approvers=approvers",
            "TASKHUB_OIDC_RECHECK_SECONDS": "0",  # every request asks the provider again
            "TASKHUB_LOCAL_PASSWORDS": "false",
        }
        env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        _wait_for(f"{servers.issuer}/.well-known/openid-configuration", provider, log)
        with daphne_process(
            port=taskhub_port,
            env=env,
            cwd=PROJECT_DIR,
            log_path=PROJECT_DIR / "test-output" / f"daphne-{taskhub_port}.log",
        ):
            yield servers
    finally:
        provider.terminate()
        provider.wait(timeout=10)


def _role_groups(username: str) -> set[str]:
    user = get_user_model().objects.get(username=username)
    return set(user.groups.filter(name__in=(ADMINS, APPROVERS, OPERATORS)).values_list("name", flat=True))


def test_a_person_signs_in_through_the_provider_and_follows_its_groups(sso, transactional_db, new_page):
    make_user("root", ADMINS, password=TEST_PASSWORD)  # a local account: its password is refused all the same
    page = new_page()
    page.goto(f"{sso.taskhub}/accounts/login/")
    expect(page.get_by_role("link", name=f"Sign in with {PROVIDER_NAME}")).to_be_visible()
    expect(page.get_by_label("Password")).to_have_count(0)
    screenshot(page, "sign-in-sso")

    csrf = next(cookie["value"] for cookie in page.context.cookies() if cookie["name"] == "csrftoken")
    refused = page.request.post(
        f"{sso.taskhub}/accounts/login/",
        form={"csrfmiddlewaretoken": csrf, "username": "root", "password": TEST_PASSWORD},
        headers={"Referer": f"{sso.taskhub}/accounts/login/"},
    )
    assert refused.status == 403
    assert "Passwords are turned off here" in refused.text()
    assert not AuditEvent.objects.filter(action="person.signed_in").exists()

    page.get_by_role("link", name=f"Sign in with {PROVIDER_NAME}").click()
    page.get_by_label("Username").fill("ada")
    page.get_by_label("Password").fill(ADA_PASSWORD)
    page.get_by_role("button", name="Log in to the provider").click()
    expect(page).to_have_url(f"{sso.taskhub}/")
    assert _role_groups("ada") == {OPERATORS, APPROVERS}
    signed_in = AuditEvent.objects.get(action="person.signed_in")
    assert signed_in.data == {"person": "ada", "method": "oidc", "issuer": sso.issuer}

    page.goto(f"{sso.taskhub}/tasks/")
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "live")
    # The provider's admin takes ada out of idp-ops; the access token taskhub holds has expired meanwhile, so taskhub
    # refreshes it before it can read ada's groups again.
    sso.provider("groups-and-expire", "ada", "idp-approvers")
    assert _role_groups("ada") == {OPERATORS, APPROVERS}  # taskhub hears of it at ada's next request
    home = page.request.get(f"{sso.taskhub}/", max_redirects=0)
    assert home.status == 200  # still signed in
    assert _role_groups("ada") == {APPROVERS}
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "offline")
    first, changed = AuditEvent.objects.filter(action="person.groups_changed").order_by("pk")
    assert (first.data["from"], first.data["to"]) == ([], [APPROVERS, OPERATORS])  # ada's first sign-in
    assert (changed.data["from"], changed.data["to"]) == ([APPROVERS, OPERATORS], [APPROVERS])
    assert changed.actor_label == f"OIDC {sso.issuer}"
