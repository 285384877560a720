"""taskhub.settings reads the environment. Each case imports the settings in a fresh interpreter."""

import json
import os
import subprocess
import sys

import pytest
from conftest import PROJECT_DIR

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
}))
"""
CONFIG_VARIABLES = ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "ALLOWED_HOSTS", "DEBUG", "TASKHUB_PGDATA")


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
        "ENGINE": "django.db.backends.postgresql",
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
        "CONFIG": {"hosts": ["redis://127.0.0.1:6379/3"], "prefix": "taskhub"},
    }


def test_redis_channel_prefix_separates_deployments_sharing_one_redis():
    loaded = load_settings(SECRET_KEY="k", REDIS_URL="redis://127.0.0.1:6379/3", REDIS_CHANNEL_PREFIX="staging")
    assert loaded["CHANNEL_LAYER"]["CONFIG"]["prefix"] == "staging"


def test_in_memory_channel_layer_without_redis_url():
    assert load_settings(SECRET_KEY="k")["CHANNEL_LAYER"] == {"BACKEND": "channels.layers.InMemoryChannelLayer"}


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
