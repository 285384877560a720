"""The live socket accepts a handshake only from the page's own origin (scheme, host and port), as Django's CSRF
check accepts a form POST, through the real ASGI application (taskhub.asgi)."""

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Group
from django.db import connections
from django.test import Client

from taskhub.live.threads import close_live_connections

pytestmark = pytest.mark.django_db(transaction=True)


def _signed_in_cookie(django_user_model) -> str:
    user = django_user_model.objects.create_user("olga")
    user.groups.add(Group.objects.get_or_create(name="operators")[0])
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


@pytest.fixture
async def connect(application, django_user_model):
    cookie = await database_sync_to_async(_signed_in_cookie)(django_user_model)
    opened = []

    async def connect(origin: str, host: str = "testserver:8000", scheme: str = "ws", extra=()) -> bool:
        headers = [(b"host", host.encode()), (b"origin", origin.encode()), (b"cookie", f"sessionid={cookie}".encode())]
        communicator = WebsocketCommunicator(application, "/ws/live/", headers=[*headers, *extra])
        communicator.scope["scheme"] = scheme
        accepted, _ = await communicator.connect()
        if accepted:
            opened.append(communicator)
        return accepted

    yield connect
    for communicator in opened:
        await communicator.disconnect()
    await database_sync_to_async(connections.close_all)()
    await sync_to_async(close_live_connections)()  # the live threads' connections would keep the test db


async def test_the_pages_own_origin_is_accepted(connect):
    assert await connect("http://testserver:8000")


@pytest.mark.parametrize(
    "origin",
    [
        "http://testserver:9999",  # another port of the same host: what AllowedHostsOriginValidator let through
        "http://testserver",
        "https://testserver:8000",  # another scheme
        "http://testserver:8000.evil.example",
        "null",
    ],
)
async def test_another_port_or_scheme_of_the_same_host_is_refused(connect, origin):
    assert not await connect(origin)


async def test_a_repeated_origin_header_is_refused(connect):
    assert not await connect("http://testserver:8000", extra=[(b"origin", b"http://testserver:9999")])


async def test_a_host_outside_allowed_hosts_is_refused_even_from_its_own_origin(connect):
    assert not await connect("http://evil.example:8000", host="evil.example:8000")


async def test_behind_a_tls_proxy_the_https_origin_is_the_pages(connect, settings):
    assert await connect("https://testserver", host="testserver", scheme="wss")
    assert not await connect("http://testserver", host="testserver", scheme="wss")
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    assert await connect("https://testserver", host="testserver", extra=[(b"x-forwarded-proto", b"https")])


async def test_an_origin_listed_in_csrf_trusted_origins_is_accepted(connect, settings):
    assert not await connect("https://dashboard.example")
    settings.CSRF_TRUSTED_ORIGINS = ["https://dashboard.example"]
    assert await connect("https://dashboard.example")
    assert not await connect("https://dashboard.example:8443")
