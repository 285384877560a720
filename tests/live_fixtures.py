"""Fixtures for tests that open live sockets on the ASGI application in the test process (loaded by conftest.py)."""

import importlib

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db import connections

from taskhub.live.threads import close_live_connections


@pytest.fixture(scope="module")
def application():
    """taskhub.asgi.application, built once the test environment has added "testserver" to ALLOWED_HOSTS. Its kept
    HTTP threads' database connections are closed after, or the test database could not be dropped at the end."""
    import taskhub.asgi

    application = importlib.reload(taskhub.asgi).application
    yield application
    application.application_mapping["http"].close_connections()


@pytest.fixture
async def fresh_layer():
    """The in-memory channel layer emptied around the test: it outlives tests, and its queues must not carry over to
    the next test's event loop. Connections opened on other threads are closed after, so the test database can be
    dropped."""
    layer = get_channel_layer()
    await layer.flush()
    yield
    await layer.flush()
    await database_sync_to_async(connections.close_all)()  # the sync_to_async thread's
    await sync_to_async(close_live_connections)()  # and the live pool's threads'
