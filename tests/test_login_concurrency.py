"""The sign-in limit holds under concurrency: 60 simultaneous sign-ins for one username (and 60 for as many
usernames from one address), through daphne with the production (slow) password hasher, get at most the
configured number of passwords checked."""

import http.client
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlencode, urlsplit

import pytest
from django.conf import settings
from django.core.cache import cache

from tests.browser_fixtures import running_daphne

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct horse battery staple"
ATTEMPTS = 60
WRONG = "That username and password do not match an account"


def sign_in_page(base_url: str) -> tuple[str, str]:
    """(the csrftoken cookie, the form's token) from the sign-in page."""
    address = urlsplit(base_url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
    connection.request("GET", "/accounts/login/")
    response = connection.getresponse()
    page = response.read().decode()
    cookie = re.search(r"csrftoken=([^;]+)", response.getheader("Set-Cookie") or "").group(1)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    connection.close()
    return cookie, token


def test_simultaneous_sign_ins_check_at_most_the_limit_of_passwords(django_user_model, production_password_hashers):
    # The production hasher, whatever the test settings use: the race is over the time the hash takes.
    user = django_user_model.objects.create_user("olga", password=PASSWORD)
    assert user.password.startswith("pbkdf2_sha256$")
    cache.clear()

    with running_daphne() as server:
        # 60 guesses at once, as an attacker sends them: exactly the limit get their password checked.
        assert simultaneous_sign_ins(server.url, [("olga", "wrong")] * ATTEMPTS) == settings.LOGIN_FAILURES_PER_USERNAME
        # And the right password after them is refused too, until the window has passed.
        assert simultaneous_sign_ins(server.url, [("olga", PASSWORD)]) == 0
        cache.clear()
        guesses = [(f"guess{n}", "wrong") for n in range(ATTEMPTS)]
        assert simultaneous_sign_ins(server.url, guesses) == settings.LOGIN_FAILURES_PER_ADDRESS
        # An X-Forwarded-For of its own on each guess changes nothing: daphne runs as in production, no proxy is
        # trusted, and the address is the peer's (issue 31, point 2: with --proxy-headers all 60 were checked).
        cache.clear()
        forged = [{"X-Forwarded-For": f"203.0.113.{n}"} for n in range(ATTEMPTS)]
        olga_again = [("olga", "wrong")] * ATTEMPTS
        assert simultaneous_sign_ins(server.url, olga_again, forged) == settings.LOGIN_FAILURES_PER_USERNAME
    cache.clear()


def simultaneous_sign_ins(
    base_url: str, credentials: list[tuple[str, str]], extra_headers: list[dict[str, str]] | None = None
) -> int:
    """Sends every sign-in at once (the n-th with extra_headers[n]); returns how many had their password checked (the
    rest were answered 429)."""
    address = urlsplit(base_url)
    cookie, token = sign_in_page(base_url)
    everyone_connected = threading.Barrier(len(credentials))

    def attempt(n: int) -> tuple[int, str]:
        username, password = credentials[n]
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=120)
        connection.connect()
        everyone_connected.wait(timeout=60)
        body = urlencode({"username": username, "password": password, "csrfmiddlewaretoken": token})
        headers = {"Content-Type": "application/x-www-form-urlencoded", "Cookie": f"csrftoken={cookie}"}
        headers.update(extra_headers[n] if extra_headers else {})
        connection.request("POST", "/accounts/login/", body=body, headers=headers)
        response = connection.getresponse()
        answer = (response.status, response.read().decode())
        connection.close()
        return answer

    with ThreadPoolExecutor(max_workers=len(credentials)) as pool:
        answers = list(pool.map(attempt, range(len(credentials))))
    statuses = [status for status, _ in answers]
    assert set(statuses) <= {200, 302, 429}, statuses
    checked = sum(1 for status, page in answers if status == 302 or (status == 200 and WRONG in page))
    assert statuses.count(429) == len(answers) - checked, statuses
    return checked
