"""The channel layer the settings pick works for real: in memory, and on Redis when REDIS_URL is set."""

import asyncio
import os
import socket
from urllib.parse import urlparse

import pytest
from django.utils.module_loading import import_string

from taskhub.settings import channel_layers_from_env
from tests.helpers import let_time_pass_async

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


async def test_an_idle_receiver_on_redis_waits_longer_than_a_blocking_pop(monkeypatch):
    # channels_redis waits for a message with BZPOPMIN … 5 s; a socket timeout of 5 s (redis-py's default)
    # made an idle consumer's receive fail with "Timeout reading from …", closing its WebSocket.
    if not redis_is_up(LOCAL_REDIS_URL):
        (pytest.fail if os.environ.get("CI") else pytest.skip)("no Redis on 127.0.0.1:6379 (.ci/run starts one)")
    monkeypatch.setenv("REDIS_URL", LOCAL_REDIS_URL)
    monkeypatch.setenv("REDIS_CHANNEL_PREFIX", f"taskhub-idle-test-{os.getpid()}")
    layer = layer_from_env()
    try:
        channel = await layer.new_channel()
        waiting = asyncio.create_task(layer.receive(channel))
        await let_time_pass_async(7, because="idle past BZPOPMIN's 5 s and the old 5 s socket timeout")
        assert not waiting.done() or waiting.exception() is None, waiting.exception()
        await layer.send(channel, {"type": "task.changed", "task": "late"})
        assert (await asyncio.wait_for(waiting, 5))["task"] == "late"
    finally:
        await layer.flush()
