"""The channel layer the settings pick works for real: in memory, and on Redis when REDIS_URL is set."""

import os
import socket
from urllib.parse import urlparse

import pytest
from django.utils.module_loading import import_string

from taskhub.settings import channel_layers_from_env

LOCAL_REDIS_URL = "redis://127.0.0.1:6379/0"


def redis_is_up(url: str) -> bool:
    address = urlparse(url)
    try:
        with socket.create_connection((address.hostname, address.port or 6379), timeout=1):
            return True
    except OSError:
        return False


def layer_from_env():
    config = channel_layers_from_env()["default"]
    return import_string(config["BACKEND"])(**config.get("CONFIG", {}))


async def round_trip(layer) -> None:
    channel = await layer.new_channel()
    await layer.send(channel, {"type": "task.changed", "task": "t-1"})
    assert await layer.receive(channel) == {"type": "task.changed", "task": "t-1"}


async def test_in_memory_layer_round_trip(monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    await round_trip(layer_from_env())


async def test_redis_layer_round_trip(monkeypatch):
    if not redis_is_up(LOCAL_REDIS_URL):
        # Outside CI a developer may have no Redis; in CI (.ci/run starts one) a missing Redis is a failure.
        (pytest.fail if os.environ.get("CI") else pytest.skip)("no Redis on 127.0.0.1:6379 (.ci/run starts one)")
    monkeypatch.setenv("REDIS_URL", LOCAL_REDIS_URL)
    layer = layer_from_env()
    try:
        await round_trip(layer)
    finally:
        await layer.flush()
