"""Sign-in rate limiting (taskhub/accounts/ratelimit.py): per username and address, and per address."""

import os
import subprocess
import time

import pytest
from django.core.cache import cache

from taskhub.accounts.groups import OPERATORS
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.helpers import free_port

pytestmark = pytest.mark.django_db

LOCKED = "Too many sign-in attempts; try again in 5 minutes."
WRONG = "That username and password do not match an account"


@pytest.fixture(autouse=True)
def empty_cache():
    cache.clear()
    yield
    cache.clear()


def sign_in(client, username, password, address="10.0.0.1"):
    return client.post("/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR=address)


def test_the_cache_is_shared_by_every_process():
    from django.conf import settings

    # A per-process cache would let each web process count on its own.
    assert settings.CACHES["default"]["BACKEND"] in (
        "django.core.cache.backends.db.DatabaseCache",
        "django.core.cache.backends.redis.RedisCache",
    )


def test_the_sixth_wrong_attempt_is_refused_with_429_and_the_right_password_too(client):
    make_user("olga", OPERATORS, password=TEST_PASSWORD)
    for _ in range(5):
        response = sign_in(client, "olga", "wrong")
        assert response.status_code == 200
        assert WRONG in response.content.decode()
    response = sign_in(client, "olga", "wrong")
    assert response.status_code == 429
    assert LOCKED in response.content.decode()
    assert WRONG not in response.content.decode()

    response = sign_in(client, "olga", TEST_PASSWORD)
    assert response.status_code == 429
    assert LOCKED in response.content.decode()
    assert "_auth_user_id" not in client.session


def test_an_unknown_username_gets_the_same_answers(client):
    for _ in range(5):
        assert WRONG in sign_in(client, "nobody", "wrong").content.decode()
    response = sign_in(client, "nobody", "wrong")
    assert response.status_code == 429
    assert LOCKED in response.content.decode()


def test_another_username_from_the_same_address_is_unaffected(client):
    make_user("olga", OPERATORS, password=TEST_PASSWORD)
    make_user("ada", OPERATORS, password=TEST_PASSWORD)
    for _ in range(6):
        sign_in(client, "olga", "wrong")
    assert sign_in(client, "olga", TEST_PASSWORD).status_code == 429
    response = sign_in(client, "ada", TEST_PASSWORD)
    assert response.status_code == 302
    # The same username from another address is not locked by these failures either.
    client.logout()
    assert sign_in(client, "olga", TEST_PASSWORD, address="10.0.0.2").status_code == 302


def test_a_successful_sign_in_resets_the_username_count(client):
    make_user("olga", OPERATORS, password=TEST_PASSWORD)
    for _ in range(4):
        sign_in(client, "olga", "wrong")
    assert sign_in(client, "olga", TEST_PASSWORD).status_code == 302
    client.logout()
    for _ in range(4):
        assert sign_in(client, "olga", "wrong").status_code == 200
    assert sign_in(client, "olga", TEST_PASSWORD).status_code == 302


def test_an_address_is_limited_across_usernames(client):
    make_user("olga", OPERATORS, password=TEST_PASSWORD)
    for n in range(20):
        assert sign_in(client, f"guess{n // 4}", "wrong").status_code == 200
    response = sign_in(client, "olga", TEST_PASSWORD)
    assert response.status_code == 429
    assert LOCKED in response.content.decode()
    # A success elsewhere does not reset the address count (only that username's).
    assert sign_in(client, "olga", TEST_PASSWORD, address="10.0.0.9").status_code == 302


def test_the_lock_ends_when_the_window_has_passed(client, settings, monkeypatch):
    make_user("olga", OPERATORS, password=TEST_PASSWORD)
    for _ in range(5):
        sign_in(client, "olga", "wrong")
    assert sign_in(client, "olga", TEST_PASSWORD).status_code == 429
    later = time.time() + settings.LOGIN_FAILURE_WINDOW_SECONDS + 1
    monkeypatch.setattr(time, "time", lambda: later)
    assert sign_in(client, "olga", TEST_PASSWORD).status_code == 302


def test_empty_fields_are_not_counted(client):
    for _ in range(10):
        assert sign_in(client, "olga", "").status_code == 200
    assert sign_in(client, "olga", "wrong").status_code == 200


def test_the_admin_sign_in_obeys_the_same_limit(client):
    make_user("root", password=TEST_PASSWORD, is_staff=True, is_superuser=True)
    for _ in range(5):
        response = client.post("/admin/login/", {"username": "root", "password": "wrong"}, REMOTE_ADDR="10.0.0.1")
        assert response.status_code == 200
    # Locked by the admin site's failures: the right password is refused there and on our page.
    response = client.post("/admin/login/", {"username": "root", "password": TEST_PASSWORD}, REMOTE_ADDR="10.0.0.1")
    assert response.status_code == 200 and "_auth_user_id" not in client.session
    assert sign_in(client, "root", TEST_PASSWORD).status_code == 429


def test_a_failure_on_our_page_counts_once(client):
    for _ in range(4):
        sign_in(client, "olga", "wrong")
    assert sign_in(client, "olga", "wrong").status_code == 200  # the fifth: still only a wrong password
    assert sign_in(client, "olga", "wrong").status_code == 429


@pytest.mark.django_db(transaction=True)
def test_failures_counted_by_another_process_lock_this_one(client):
    """Several web processes share the count: failures recorded by a separate Python process lock sign-in here."""
    from tests.browser_fixtures import database_url_for_subprocesses
    from tests.conftest import PROJECT_DIR, VENV_BIN

    env = {**os.environ, "DATABASE_URL": database_url_for_subprocesses(), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    env.pop("REDIS_URL", None)
    script = (
        "import django; django.setup()\n"
        "from taskhub.accounts import ratelimit\n"
        "for _ in range(5): ratelimit.record_failure('olga', '10.0.0.1')\n"
    )
    subprocess.run([str(VENV_BIN / "python"), "-c", script], cwd=PROJECT_DIR, env=env, check=True, timeout=60)
    make_user("olga", OPERATORS, password=TEST_PASSWORD)
    assert sign_in(client, "olga", TEST_PASSWORD).status_code == 429
    assert sign_in(client, "olga", TEST_PASSWORD, address="10.0.0.2").status_code == 302


def test_with_redis_unreachable_sign_in_works_and_stays_limited_counting_in_the_database(client, settings, caplog):
    from django.core.cache import caches

    port = free_port()
    # Nothing listens on that port: a Redis that is down. The fallback is the database cache, as configured.
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{port}/0",
            "OPTIONS": {"socket_connect_timeout": 2, "socket_timeout": 2},
        },
        settings.FALLBACK_CACHE: {
            "BACKEND": "django.core.cache.backends.db.DatabaseCache",
            "LOCATION": "taskhub_cache",
        },
    }
    caches[settings.FALLBACK_CACHE].clear()
    make_user("olga", OPERATORS, password=TEST_PASSWORD)
    for _ in range(5):
        assert sign_in(client, "olga", "wrong").status_code == 200
    assert sign_in(client, "olga", TEST_PASSWORD).status_code == 429
    assert "counting in the 'database' cache meanwhile" in caplog.text
    caches[settings.FALLBACK_CACHE].clear()
    assert sign_in(client, "olga", TEST_PASSWORD).status_code == 302
