"""taskhub.settings reads the environment. Each case imports the settings in a fresh interpreter."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import PROJECT_DIR

DUMP_SETTINGS = """
import json
from django.conf import settings
settings._setup()
print(json.dumps({
    "DEBUG": settings.DEBUG,
    "SECRET_KEY": settings.SECRET_KEY,
    "ALLOWED_HOSTS": settings.ALLOWED_HOSTS,
    "DATABASE": {key: settings.DATABASES["default"].get(key) for key in ("ENGINE", "NAME", "HOST", "PORT", "USER")},
    "CHANNEL_LAYER": settings.CHANNEL_LAYERS["default"],
    "STATICFILES_STORAGE": settings.STORAGES["staticfiles"]["BACKEND"],
    "SECURE_SSL_REDIRECT": settings.SECURE_SSL_REDIRECT,
    "SESSION_COOKIE_SECURE": settings.SESSION_COOKIE_SECURE,
}, default=lambda value: f"{value.__module__}.{value.__qualname__}"))  # classes (e.g. exceptions) by name
"""
CONFIG_VARIABLES = (
    "DATABASE_URL",
    "REDIS_URL",
    "SECRET_KEY",
    "ALLOWED_HOSTS",
    "DEBUG",
    "TASKHUB_PGDATA",
    "HTTPS_ONLY",
    "LOG_FORMAT",
    "TRUST_X_FORWARDED_PROTO",
)


def run_settings(**env: str) -> subprocess.CompletedProcess:
    clean = {key: value for key, value in os.environ.items() if key not in CONFIG_VARIABLES}
    clean["DJANGO_SETTINGS_MODULE"] = "taskhub.settings"
    return subprocess.run(
        [sys.executable, "-c", DUMP_SETTINGS], env={**clean, **env}, cwd=PROJECT_DIR, capture_output=True, text=True
    )


def load_settings(**env: str) -> dict:
    process = run_settings(**env)
    assert process.returncode == 0, process.stderr
    return json.loads(process.stdout)


def test_database_url_is_used_when_set():
    loaded = load_settings(SECRET_KEY="k", DATABASE_URL="postgres://alice:pw@db.example:6543/hub")
    assert loaded["DATABASE"] == {
        "ENGINE": "taskhub.database",  # Django's PostgreSQL backend, its health check asking the socket first
        "NAME": "hub",
        "HOST": "db.example",
        "PORT": 6543,
        "USER": "alice",
    }


def test_embedded_postgres_when_database_url_unset_and_not_started_by_settings(tmp_path):
    loaded = load_settings(SECRET_KEY="k", TASKHUB_PGDATA=str(tmp_path / "pgdata"))
    assert loaded["DATABASE"]["ENGINE"] == "taskhub.embedded_pg"
    assert loaded["DATABASE"]["NAME"] == "taskhub"
    # Reading the settings must not start a server: it starts on the first connection.
    assert not (tmp_path / "pgdata").exists()


def test_redis_url_selects_the_redis_channel_layer():
    loaded = load_settings(SECRET_KEY="k", REDIS_URL="redis://127.0.0.1:6379/3")
    assert loaded["CHANNEL_LAYER"] == {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            "hosts": [
                {
                    "address": "redis://127.0.0.1:6379/3",
                    "socket_timeout": 30,
                    "socket_connect_timeout": 5,
                    # A connection closed by a restarted Redis is reconnected once, not failed (test_faults.py).
                    "retry_on_error": ["redis.exceptions.ConnectionError"],
                }
            ],
            "prefix": "taskhub",
            # The live hub's one channel per process carries every group's messages (taskhub/live/hub.py).
            "capacity": 2000,
        },
    }


def test_redis_channel_prefix_separates_deployments_sharing_one_redis():
    loaded = load_settings(SECRET_KEY="k", REDIS_URL="redis://127.0.0.1:6379/3", REDIS_CHANNEL_PREFIX="staging")
    assert loaded["CHANNEL_LAYER"]["CONFIG"]["prefix"] == "staging"


def test_in_memory_channel_layer_without_redis_url():
    assert load_settings(SECRET_KEY="k")["CHANNEL_LAYER"] == {
        "BACKEND": "channels.layers.InMemoryChannelLayer",
        "CONFIG": {"capacity": 2000},
    }


def test_production_defaults():
    loaded = load_settings(SECRET_KEY="s3cret", ALLOWED_HOSTS="hub.example, ops.example")
    assert loaded["DEBUG"] is False
    assert loaded["SECRET_KEY"] == "s3cret"
    assert loaded["ALLOWED_HOSTS"] == ["hub.example", "ops.example"]
    assert loaded["STATICFILES_STORAGE"] == "whitenoise.storage.CompressedManifestStaticFilesStorage"


def test_secret_key_is_required_without_debug():
    process = run_settings()
    assert process.returncode != 0
    assert "SECRET_KEY must be set when DEBUG is off" in process.stderr


def test_debug_gets_a_development_secret_key():
    loaded = load_settings(DEBUG="true")
    assert loaded["DEBUG"] is True
    assert loaded["SECRET_KEY"].startswith("django-insecure-")


@pytest.mark.parametrize("word", ["maybe", "2"])
def test_debug_must_be_a_boolean(word):
    process = run_settings(DEBUG=word, SECRET_KEY="k")
    assert process.returncode != 0
    assert f"DEBUG={word!r} is not a boolean" in process.stderr


@pytest.mark.parametrize("grace", ["-1", "41"])
def test_the_dead_worker_grace_must_lie_within_the_settle_time(grace):
    process = run_settings(
        SECRET_KEY="k", TASKHUB_DELIVERY_SETTLE_SECONDS="40", TASKHUB_DEAD_WORKER_GRACE_SECONDS=grace
    )
    assert process.returncode != 0
    assert "TASKHUB_DEAD_WORKER_GRACE_SECONDS must be between 0 and TASKHUB_DELIVERY_SETTLE_SECONDS" in process.stderr
    assert run_settings(SECRET_KEY="k", TASKHUB_DEAD_WORKER_GRACE_SECONDS="0").returncode == 0, "0: no grace at all"


def test_production_is_https_only_unless_told_otherwise():
    production = load_settings(SECRET_KEY="s3cret")
    assert production["SECURE_SSL_REDIRECT"] is True
    assert production["SESSION_COOKIE_SECURE"] is True
    plain = load_settings(SECRET_KEY="s3cret", HTTPS_ONLY="false")
    assert plain["SECURE_SSL_REDIRECT"] is False
    assert load_settings(DEBUG="true")["SESSION_COOKIE_SECURE"] is False


def test_check_deploy_is_clean_with_the_documented_production_settings():
    clean = {key: value for key, value in os.environ.items() if key not in CONFIG_VARIABLES}
    env = {
        **clean,
        "DJANGO_SETTINGS_MODULE": "taskhub.settings",
        "SECRET_KEY": "a-production-secret-" + "x" * 40,
        "ALLOWED_HOSTS": "hub.example",
        "DATABASE_URL": "postgres://taskhub@db.example/taskhub",
        "REDIS_URL": "redis://redis.example:6379/0",
        "HSTS_INCLUDE_SUBDOMAINS": "true",
        "HSTS_PRELOAD": "true",
    }
    process = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        env=env,
        cwd=PROJECT_DIR,
        capture_output=True,
        text=True,
    )
    assert process.returncode == 0, process.stdout + process.stderr
    assert "no issues" in process.stdout


def test_json_logs_are_one_object_per_line():
    script = "import logging; from django.conf import settings; settings._setup(); import django; django.setup(); "
    script += "logging.getLogger('taskhub.demo').warning('server says %s', '<b>hi</b>')"
    clean = {key: value for key, value in os.environ.items() if key not in CONFIG_VARIABLES}
    env = {**clean, "DJANGO_SETTINGS_MODULE": "taskhub.settings", "DEBUG": "true", "LOG_FORMAT": "json"}
    process = subprocess.run([sys.executable, "-c", script], env=env, cwd=PROJECT_DIR, capture_output=True, text=True)
    assert process.returncode == 0, process.stderr
    record = json.loads(process.stderr.strip().splitlines()[-1])
    assert record["level"] == "WARNING"
    assert record["logger"] == "taskhub.demo"
    assert record["message"] == "server says <b>hi</b>"
    assert "time" in record
