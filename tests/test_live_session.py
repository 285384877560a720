"""The live socket ends with its session: signing out, a password change and the session's expiry close it
(through the real ASGI application), while the user's other sessions keep theirs."""

from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Group
from django.contrib.sessions.models import Session
from django.test import Client
from django.utils import timezone

from taskhub.live import consumer, publish
from taskhub.live.access import session_expiries, session_expiry
from taskhub.live.consumer import CLOSE_NOT_SIGNED_IN

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_layer")]

PASSWORD = "correct horse battery staple"
# Generous for a loaded machine; a socket that closes does so as soon as it hears the message.
CLOSE_WAIT_SECONDS = 10


@pytest.fixture
def operator(django_user_model):
    user = django_user_model.objects.create_user("olga")
    user.groups.add(Group.objects.get_or_create(name="operators")[0])
    return user


def signed_in_client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
async def open_socket(application):
    opened = []

    async def open_socket(client: Client) -> WebsocketCommunicator:
        cookie = client.cookies["sessionid"].value
        headers = [
            (b"host", b"testserver"),
            (b"origin", b"http://testserver"),
            (b"cookie", f"sessionid={cookie}".encode()),
        ]
        communicator = WebsocketCommunicator(application, "/ws/live/", headers=headers)
        accepted, _ = await communicator.connect()
        assert accepted
        await communicator.receive_from(timeout=5)  # the nav counts sent on connect
        opened.append(communicator)
        return communicator

    yield open_socket
    for communicator in opened:
        await communicator.disconnect()


async def closed_with(communicator: WebsocketCommunicator) -> int:
    while True:
        message = await communicator.receive_output(timeout=CLOSE_WAIT_SECONDS)
        if message["type"] == "websocket.close":
            return message.get("code")


async def still_open(communicator: WebsocketCommunicator) -> bool:
    await communicator.send_json_to({"ping": 1})  # a message the consumer ignores
    return await communicator.receive_nothing(timeout=0.3)


async def test_signing_out_closes_that_sessions_sockets_only(operator, open_socket):
    leaving = await database_sync_to_async(signed_in_client)(operator)
    staying = await database_sync_to_async(signed_in_client)(operator)
    socket, other_session_socket = await open_socket(leaving), await open_socket(staying)

    response = await database_sync_to_async(leaving.post)("/accounts/logout/")
    assert response.status_code == 302
    assert await closed_with(socket) == CLOSE_NOT_SIGNED_IN
    assert await still_open(other_session_socket)


async def test_a_password_change_closes_the_sockets_of_sessions_made_with_the_old_password(operator, open_socket):
    socket = await open_socket(await database_sync_to_async(signed_in_client)(operator))

    def change_password():
        operator.set_password(PASSWORD)
        operator.save()

    await database_sync_to_async(change_password)()
    assert await closed_with(socket) == CLOSE_NOT_SIGNED_IN


async def test_a_socket_closes_when_its_session_expires(operator, open_socket):
    def expiring_soon() -> Client:
        client = signed_in_client(operator)
        session = client.session
        session.set_expiry(2)
        session.save()
        return client

    socket = await open_socket(await database_sync_to_async(expiring_soon)())
    assert await closed_with(socket) == CLOSE_NOT_SIGNED_IN


async def test_a_session_deleted_without_a_message_is_found_when_the_access_is_read_again(operator, open_socket):
    client = await database_sync_to_async(signed_in_client)(operator)
    socket = await open_socket(client)
    # clearsessions, an admin deleting rows, a lost sign-out message: nothing tells the socket ...
    await database_sync_to_async(Session.objects.filter(session_key=client.session.session_key).delete)()
    assert await still_open(socket)
    # ... until it reads its access again (on access.changed, or on a change once its read is 30 s old).
    await sync_to_async(publish.publish_access_changed)(user_ids=[operator.pk])
    assert await closed_with(socket) == CLOSE_NOT_SIGNED_IN


async def test_a_session_deleted_without_a_message_is_found_by_the_background_read_with_no_change(
    operator, open_socket, monkeypatch
):
    """Each process reads its sockets' access and sessions again before they are too old for a change to use, so
    that a change never waits for those reads (bench/fanout.py); here after 0.2 s instead of 15 s."""
    monkeypatch.setattr(consumer, "ACCESS_REFRESH_AFTER_SECONDS", 0.0)
    monkeypatch.setattr(consumer, "ACCESS_SWEEP_SECONDS", 0.2)
    client = await database_sync_to_async(signed_in_client)(operator)
    socket = await open_socket(client)
    await database_sync_to_async(Session.objects.filter(session_key=client.session.session_key).delete)()
    assert await closed_with(socket) == CLOSE_NOT_SIGNED_IN


async def test_a_session_extended_meanwhile_keeps_its_socket(operator, open_socket):
    def expiring_soon() -> Client:
        client = signed_in_client(operator)
        session = client.session
        session.set_expiry(1)
        session.save()
        return client

    client = await database_sync_to_async(expiring_soon)()
    socket = await open_socket(client)

    def extend():
        later = timezone.now() + timedelta(hours=1)
        Session.objects.filter(session_key=client.session.session_key).update(expire_date=later)

    await database_sync_to_async(extend)()
    assert await socket.receive_nothing(timeout=2.5)  # past the first expiry: checked again, extended
    assert await still_open(socket)


def test_sessions_checked_together_answer_as_each_checked_alone(operator, django_user_model):
    """The batch a process's sockets make when they re-check their sessions (two queries for any number)."""
    other = django_user_model.objects.create_user("oscar")
    clients = {name: signed_in_client(operator) for name in ("kept", "signed_out", "made_before_the_password")}
    clients["oscars"] = signed_in_client(other)
    keys = {name: client.session.session_key for name, client in clients.items()}
    kept, signed_out = clients["kept"], clients["signed_out"]
    signed_out.logout()
    operator.set_password(PASSWORD)
    operator.save()
    kept.force_login(operator)  # signed in again after the change: a new key with the new password
    keys["kept"] = kept.session.session_key
    asked = [
        (keys["kept"], operator.pk),
        (keys["signed_out"], operator.pk),
        (keys["made_before_the_password"], operator.pk),
        (keys["oscars"], operator.pk),  # someone else's session
        (keys["oscars"], other.pk),
        (None, operator.pk),
    ]
    together = session_expiries(asked)
    assert together == [session_expiry(key, user_id) for key, user_id in asked]
    assert [expiry is not None for expiry in together] == [True, False, False, False, True, False]
