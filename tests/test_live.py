"""The live socket against the real ASGI app: who is let in, who hears what, and publishing that never fails."""

import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from channels.testing import WebsocketCommunicator
from channels_redis.core import RedisChannelLayer
from django.contrib.auth.models import Group
from django.db import connection, connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from taskhub.live import consumer, publish
from taskhub.live.access import current_access
from taskhub.live.consumer import CLOSE_HUB_LOST, CLOSE_NO_LONGER_ALLOWED, CLOSE_NOT_SIGNED_IN
from taskhub.live.fragments import FragmentKind, Sharing, register_task_fragment, unregister_task_fragment
from taskhub.live.groups import TASKS_GROUP, inbox_group, task_group, user_group
from taskhub.live.hub import Hub, hub_for
from taskhub.mcp.client import TaskCreated
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import TaskPoll
from tests.approval_fixtures import set_approver_groups
from tests.catalogue_fixtures import with_tools
from tests.conftest import PROJECT_DIR
from tests.helpers import free_port, snapshot
from tests.test_channel_layer import LOCAL_REDIS_URL, redis_is_up

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_layer")]

ORIGIN = b"http://testserver"
QUIET_SECONDS = 0.3
APPROVAL_REQUEST = {
    "method": "elicitation/create",
    "params": {"message": "Deploy <b>now</b>?", "requestedSchema": {"type": "object", "properties": {}}},
}


def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def user_in(django_user_model, name: str, *groups: str):
    user = django_user_model.objects.create_user(name)
    for group in groups:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    return user


@pytest.fixture
def socket_for(application):
    async def socket_for(user=None, origin: bytes = ORIGIN) -> WebsocketCommunicator:
        cookie = await database_sync_to_async(session_cookie)(user) if user is not None else None
        return _socket(application, cookie, origin)

    return socket_for


def _socket(application, cookie: str | None, origin: bytes) -> WebsocketCommunicator:
    headers = [(b"host", b"testserver"), (b"origin", origin)]
    if cookie is not None:
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    return WebsocketCommunicator(application, "/ws/live/", headers=headers)


@pytest.fixture
def server(db):
    return create_server(name="alpha", transport="http", url="http://127.0.0.1:9/mcp", user=None)


@pytest.fixture
def other_server(db):
    other = create_server(name="beta", transport="http", url="http://127.0.0.1:9/other", user=None)
    set_approver_groups(other, [Group.objects.get_or_create(name="beta-approvers")[0]])
    return other


@pytest.fixture
def operator(django_user_model):
    return user_in(django_user_model, "olga", "operators")


@pytest.fixture
def live_task(server, operator):
    """A durable task in status working, made through the services as the launch job would."""
    return launched_on(server, operator)


@pytest.fixture
def task_fragments():
    """A page's registered fragments, as the list, detail and inbox pages will register theirs."""
    registered = []

    def register(kind, render, sharing=Sharing.USER):
        register_task_fragment(kind, render, sharing=sharing)
        registered.append((kind, render))

    yield register
    for kind, render in registered:
        unregister_task_fragment(kind, render)


def launched_on(server, user):
    task = services.launch(server=with_tools(server, "deploy"), tool="deploy", arguments={}, user=user)
    return services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot()))


async def connected(communicator: WebsocketCommunicator) -> str:
    """Connect and return the fragments sent on connect (the nav counts)."""
    accepted, _ = await communicator.connect()
    assert accepted
    return await communicator.receive_from(timeout=5)


apply_snapshot = database_sync_to_async(services.apply_snapshot)


# --- who is let in -----------------------------------------------------------------------------------


async def test_anonymous_user_is_refused_with_a_close_code(socket_for):
    communicator = await socket_for(user=None)
    accepted, code = await communicator.connect()
    assert not accepted
    assert code == CLOSE_NOT_SIGNED_IN


async def test_a_foreign_origin_is_refused(socket_for, operator):
    communicator = await socket_for(operator, origin=b"https://evil.example")
    accepted, _ = await communicator.connect()
    assert not accepted


@pytest.mark.parametrize(
    "origin",
    [
        b"http://testserver.evil.example",
        b"http://evil.example/?testserver",
        b"http://testserver@evil.example",
        b"null",
        b"file://",
    ],
)
async def test_look_alike_and_opaque_origins_are_refused(socket_for, operator, origin):
    communicator = await socket_for(operator, origin=origin)
    accepted, _ = await communicator.connect()
    assert not accepted


async def test_a_socket_without_an_origin_is_refused(application, operator):
    # What a non-browser client sends if it sends nothing: a stolen cookie alone does not open the socket.
    cookie = await database_sync_to_async(session_cookie)(operator)
    headers = [(b"host", b"testserver"), (b"cookie", f"sessionid={cookie}".encode())]
    accepted, _ = await WebsocketCommunicator(application, "/ws/live/", headers=headers).connect()
    assert not accepted


async def test_a_forged_session_or_one_signed_out_or_of_a_deactivated_user_is_refused(application, operator):
    forged = _socket(application, "0123456789abcdefghijklmnopqrstuv", ORIGIN)
    assert await forged.connect() == (False, CLOSE_NOT_SIGNED_IN)

    signed_out = await database_sync_to_async(session_cookie)(operator)
    await database_sync_to_async(
        lambda: Client(headers={"cookie": f"sessionid={signed_out}"}).post("/accounts/logout/")
    )()
    assert await _socket(application, signed_out, ORIGIN).connect() == (False, CLOSE_NOT_SIGNED_IN)

    cookie = await database_sync_to_async(session_cookie)(operator)
    operator.is_active = False
    await database_sync_to_async(operator.save)()
    assert await _socket(application, cookie, ORIGIN).connect() == (False, CLOSE_NOT_SIGNED_IN)


async def test_connect_sends_the_nav_counts_from_the_database(socket_for, operator, live_task):
    communicator = await socket_for(operator)
    html = await connected(communicator)
    assert 'id="nav-running-count" hx-swap-oob="true"' in html
    assert ">1</span>" in html  # the one working task
    assert 'data-approver="no"></span>' in html  # not an approver: an empty badge in the hidden Inbox item
    await communicator.disconnect()


async def test_each_socket_hears_in_its_readers_language(application, django_user_model, operator, live_task):
    """olga reads English; mei chose Chinese (her profile, copied into the session at sign-in); olga's second tab is
    in a browser that asks for Chinese. The nav counts pushed on connect and after a change are in each one's
    language, though olga and mei are one audience (operators): the language is part of what is shared."""
    from taskhub.accounts.models import Profile

    mei = await sync_to_async(user_in)(django_user_model, "mei", "operators")
    await sync_to_async(Profile.objects.create)(user=mei, language="zh-hans")
    english = _socket(application, await database_sync_to_async(session_cookie)(operator), ORIGIN)
    chinese = _socket(application, await database_sync_to_async(session_cookie)(mei), ORIGIN)
    olga_cookie = await database_sync_to_async(session_cookie)(operator)
    browser_chinese = WebsocketCommunicator(
        application,
        "/ws/live/",
        headers=[
            (b"host", b"testserver"),
            (b"origin", ORIGIN),
            (b"cookie", f"sessionid={olga_cookie}".encode()),
            (b"accept-language", b"zh-CN,zh;q=0.9,en;q=0.5"),
        ],
    )
    sockets = {"english": english, "chinese": chinese, "browser chinese": browser_chinese}
    on_connect = {name: await connected(socket) for name, socket in sockets.items()}
    assert 'aria-label="running tasks"' in on_connect["english"] and "运行中的任务" not in on_connect["english"]
    for name in ("chinese", "browser chinese"):
        assert 'aria-label="运行中的任务"' in on_connect[name] and "running tasks" not in on_connect[name], name

    await apply_snapshot(task=live_task, snapshot=snapshot("completed", result={"content": []}))
    heard = {name: await socket.receive_from(timeout=5) for name, socket in sockets.items()}
    assert 'aria-label="running tasks"' in heard["english"] and ">0</span>" in heard["english"]
    assert 'aria-label="运行中的任务"' in heard["chinese"] and ">0</span>" in heard["chinese"]
    assert heard["browser chinese"] == heard["chinese"]  # one audience and one language: the same bytes
    for socket in sockets.values():
        await socket.disconnect()


# --- who hears what ----------------------------------------------------------------------------------


async def test_operator_hears_a_real_task_change_as_fragments(socket_for, operator, live_task, task_fragments):
    rendered = []
    task_fragments(FragmentKind.TASKS, lambda task, user: rendered.append(user) or f'<tr id="row-{task.pk}"></tr>')
    communicator = await socket_for(operator)
    await connected(communicator)

    changed = await apply_snapshot(task=live_task, snapshot=snapshot("completed", result={"content": []}))
    assert changed

    html = await communicator.receive_from(timeout=5)
    assert f'<tr id="row-{live_task.pk}"></tr>' in html
    assert 'id="nav-running-count" hx-swap-oob="true"' in html and ">0</span>" in html
    assert [user.username for user in rendered] == ["olga"]
    # one change, heard once, although it was sent to several groups
    assert await communicator.receive_nothing(timeout=QUIET_SECONDS)
    await communicator.disconnect()


async def test_a_change_reaches_a_socket_while_the_process_sync_thread_is_busy(socket_for, operator, live_task):
    """Renderings do not queue behind other work on channels' one process-wide sync thread (where they ran
    before: the next socket message waited for whatever ran there)."""
    communicator = await socket_for(operator)
    await connected(communicator)
    release = threading.Event()
    busy = asyncio.ensure_future(sync_to_async(release.wait)(10))  # thread-sensitive: occupies that thread
    try:
        await asyncio.to_thread(apply_in_own_thread, task=live_task, snapshot=snapshot("completed"))
        html = await communicator.receive_from(timeout=5)
        assert f'id="task-row-{live_task.pk}"' in html and not busy.done()
    finally:
        release.set()
        await busy
    await communicator.disconnect()


def apply_in_own_thread(**kwargs):
    try:
        return services.apply_snapshot(**kwargs)
    finally:
        connections.close_all()


async def test_approver_hears_input_requests_of_their_server_only(
    socket_for, django_user_model, server, other_server, live_task, task_fragments
):
    task_fragments(FragmentKind.INBOX, lambda task, user: f'<article id="card-{task.pk}"></article>')
    approver_of_alpha = await sync_to_async(user_in)(django_user_model, "amy", "approvers", "alpha-approvers")
    approver_of_beta_only = await sync_to_async(user_in)(django_user_model, "ben", "approvers", "beta-approvers")
    await sync_to_async(set_approver_groups)(server, [await sync_to_async(Group.objects.get)(name="alpha-approvers")])
    amy, ben = await socket_for(approver_of_alpha), await socket_for(approver_of_beta_only)
    assert ">0</span>" in await connected(amy)
    await connected(ben)

    await apply_snapshot(task=live_task, snapshot=snapshot("input_required", inputRequests={"ok": APPROVAL_REQUEST}))

    html = await amy.receive_from(timeout=5)
    assert f'<article id="card-{live_task.pk}"></article>' in html
    assert 'id="nav-inbox-count" hx-swap-oob="true" aria-label="open requests" data-approver="yes">1</span>' in html
    assert await ben.receive_nothing(timeout=QUIET_SECONDS)
    await amy.disconnect()
    await ben.disconnect()


async def test_watching_a_task_is_granted_only_to_who_may_see_it(
    socket_for, django_user_model, server, other_server, live_task, task_fragments
):
    task_fragments(FragmentKind.TASK, lambda task, user: f'<header id="task-{task.pk}">{task.status}</header>')
    outsider = await sync_to_async(user_in)(django_user_model, "ben", "approvers", "beta-approvers")
    await sync_to_async(set_approver_groups)(server, [await sync_to_async(Group.objects.get)(name="operators")])
    communicator = await socket_for(outsider)
    await connected(communicator)

    await communicator.send_json_to({"watch": str(live_task.pk)})
    assert await communicator.receive_nothing(timeout=QUIET_SECONDS)
    await apply_snapshot(task=live_task, snapshot=snapshot(statusMessage="halfway"))
    assert await communicator.receive_nothing(timeout=QUIET_SECONDS)
    await communicator.disconnect()


async def test_watching_a_visible_task_sends_it_now_and_on_every_change(
    socket_for, operator, live_task, task_fragments
):
    task_fragments(
        FragmentKind.TASK_STATUS, lambda task, user: f'<header id="task-{task.pk}">{task.status_message}</header>'
    )
    communicator = await socket_for(operator)
    await connected(communicator)

    await communicator.send_json_to({"watch": str(live_task.pk)})
    assert f'<header id="task-{live_task.pk}"></header>' in await communicator.receive_from(timeout=5)

    await apply_snapshot(task=live_task, snapshot=snapshot(statusMessage="halfway"))
    assert f'<header id="task-{live_task.pk}">halfway</header>' in await communicator.receive_from(timeout=5)
    await communicator.disconnect()


def watched_sections(user_id: int, task_id) -> tuple[str, list[str]]:
    """A watched task's sections as a change renders them for the user's socket, and the statements it sent."""
    user, access = current_access(user_id)
    task = consumer._task_or_none(task_id)
    with CaptureQueriesContext(connection) as queries:
        parts = [(kind, Sharing.USER) for kind in consumer.WATCHED_KINDS]
        html = "".join(consumer._render_parts(task, parts, user, access))
    return html, [query["sql"] for query in queries.captured_queries]


def test_a_change_rendered_for_a_socket_asks_no_roles_again(operator, live_task):
    # The page fragments ask for roles again and again (sees_all_tasks, may_see_task, may_cancel, ...); each asking
    # was a query, eight per change for a watched task (bench/freshness.py). The socket's user carries the roles
    # read with its access, and is read again with it.
    html, statements = watched_sections(operator.pk, live_task.pk)
    assert f'id="task-{live_task.pk}-header"' in html
    assert [sql for sql in statements if '"auth_user_groups"' in sql] == []

    operator.groups.clear()
    user, access = current_access(operator.pk)
    assert not access.may_see_task(live_task) and not user.taskhub_roles.operator


def test_a_watched_tasks_sections_read_its_next_poll_with_the_task(operator, live_task):
    # The task as read for a change comes with its poll: the facts' "next poll" is no query of its own per change.
    TaskPoll.objects.update_or_create(task=live_task, defaults={"next_poll_at": timezone.now()})
    html, statements = watched_sections(operator.pk, live_task.pk)
    assert f'id="task-{live_task.pk}-header"' in html
    assert [sql for sql in statements if '"tasks_taskpoll"' in sql] == []


async def test_a_page_fragment_that_fails_costs_only_itself(socket_for, operator, live_task, task_fragments):
    def broken(task, user):
        raise RuntimeError("a page bug")

    task_fragments(FragmentKind.TASKS, broken)
    communicator = await socket_for(operator)
    await connected(communicator)
    await apply_snapshot(task=live_task, snapshot=snapshot(statusMessage="halfway"))
    assert 'id="nav-running-count"' in await communicator.receive_from(timeout=5)
    await communicator.disconnect()


# --- one rendering per audience, shared by its sockets --------------------------------------------------


async def test_sockets_of_one_audience_share_a_rendering_and_hear_only_the_tasks_they_may_see(
    socket_for, django_user_model, server, other_server, operator, task_fragments
):
    """amy and amos approve for alpha (one audience), ben for beta only; amy has two tabs open."""
    shared_renders, user_renders = [], []

    def for_the_audience(task, user):
        shared_renders.append(task.server.name)
        return f'<i id="shared-{task.pk}"></i>'

    def for_the_user(task, user):
        user_renders.append(user.username)
        return f'<b id="{user.username}-{task.pk}"></b>'

    task_fragments(FragmentKind.INBOX, for_the_audience, Sharing.AUDIENCE)
    task_fragments(FragmentKind.INBOX, for_the_user)
    alpha_approvers = await sync_to_async(Group.objects.create)(name="alpha-approvers")
    await sync_to_async(set_approver_groups)(server, [alpha_approvers])
    amy, amos, ben = [
        await sync_to_async(user_in)(django_user_model, name, "approvers", group)
        for name, group in (("amy", "alpha-approvers"), ("amos", "alpha-approvers"), ("ben", "beta-approvers"))
    ]
    alpha_task = await database_sync_to_async(launched_on)(server, operator)
    beta_task = await database_sync_to_async(launched_on)(other_server, operator)
    tabs = {"amy": amy, "amy2": amy, "amos": amos, "ben": ben}
    sockets = {name: await socket_for(user) for name, user in tabs.items()}
    for communicator in sockets.values():
        await connected(communicator)
    asking = snapshot("input_required", inputRequests={"ok": APPROVAL_REQUEST})

    await apply_snapshot(task=alpha_task, snapshot=asking)
    heard = {name: await sockets[name].receive_from(timeout=5) for name in ("amy", "amy2", "amos")}
    assert f'<i id="shared-{alpha_task.pk}"></i>' in heard["amy"]
    assert f'<b id="amy-{alpha_task.pk}"></b>' in heard["amy"] and "amos-" not in heard["amy"]
    assert heard["amy2"] == heard["amy"]
    assert f'<b id="amos-{alpha_task.pk}"></b>' in heard["amos"] and "amy-" not in heard["amos"]
    assert f'<i id="shared-{alpha_task.pk}"></i>' in heard["amos"]
    assert await sockets["ben"].receive_nothing(timeout=QUIET_SECONDS)
    assert shared_renders == ["alpha"]  # once for the audience of amy and amos
    assert sorted(user_renders) == ["amos", "amy"]  # once per user, not per socket

    await apply_snapshot(task=beta_task, snapshot=asking)
    heard_by_ben = await sockets["ben"].receive_from(timeout=5)
    assert f'<i id="shared-{beta_task.pk}"></i>' in heard_by_ben and f'<b id="ben-{beta_task.pk}"></b>' in heard_by_ben
    for name in ("amy", "amy2", "amos"):
        assert await sockets[name].receive_nothing(timeout=QUIET_SECONDS), f"{name} heard of a beta task"
    assert shared_renders == ["alpha", "beta"]
    for communicator in sockets.values():
        await communicator.disconnect()


async def test_one_change_renders_each_part_once_for_sockets_of_different_pages_and_roles(
    socket_for, django_user_model, server, other_server, operator, live_task, task_fragments
):
    """olga (operator) has the list and the task's page open, oscar (operator) the list; amy approves for alpha (the
    task's server), ben for beta only. The list's part is rendered once for both operators' three sockets (though
    olga's detail socket asks for more), the task's page's once for olga, the inbox's once for amy; ben gets nothing."""
    renders = Counter()

    def list_part(task, user):
        renders["list"] += 1
        return f'<i id="list-{task.pk}"></i>'

    def detail_part(task, user):
        renders[f"detail {user.username}"] += 1
        return f'<b id="detail-{task.pk}">{task.status_message}</b>'

    def inbox_part(task, user):
        renders["inbox"] += 1
        return f'<u id="inbox-{task.pk}"></u>'

    task_fragments(FragmentKind.TASKS, list_part, Sharing.AUDIENCE)
    task_fragments(FragmentKind.TASK, detail_part)
    task_fragments(FragmentKind.INBOX, inbox_part, Sharing.AUDIENCE)
    await sync_to_async(set_approver_groups)(
        server, [await sync_to_async(Group.objects.create)(name="alpha-approvers")]
    )
    oscar = await sync_to_async(user_in)(django_user_model, "oscar", "operators")
    amy = await sync_to_async(user_in)(django_user_model, "amy", "approvers", "alpha-approvers")
    ben = await sync_to_async(user_in)(django_user_model, "ben", "approvers", "beta-approvers")
    tabs = {"olga list": operator, "olga detail": operator, "oscar list": oscar, "amy": amy, "ben": ben}
    sockets = {name: await socket_for(user) for name, user in tabs.items()}
    for communicator in sockets.values():
        await connected(communicator)
    await sockets["olga detail"].send_json_to({"watch": str(live_task.pk)})
    assert f'id="detail-{live_task.pk}"' in await sockets["olga detail"].receive_from(timeout=5)
    renders.clear()

    await apply_snapshot(
        task=live_task,
        snapshot=snapshot("input_required", statusMessage="asking", inputRequests={"ok": APPROVAL_REQUEST}),
    )
    heard = {name: await sockets[name].receive_from(timeout=5) for name in ("olga list", "oscar list", "amy")}
    assert f'<i id="list-{live_task.pk}"></i>' in heard["olga list"]
    assert heard["oscar list"] == heard["olga list"]  # one audience: the same bytes
    # The watched task's status comes first, in a frame of its own, then its other sections; the list's part and the
    # nav counts after.
    status, watched, rest = [await sockets["olga detail"].receive_from(timeout=5) for _ in range(3)]
    assert f'id="task-{live_task.pk}-header"' in status and 'id="detail-' not in status  # the page's real status
    assert f'<b id="detail-{live_task.pk}">asking</b>' in watched
    assert f'id="task-{live_task.pk}-timeline"' in watched  # the page's real sections
    assert f'id="task-{live_task.pk}-header"' not in watched
    assert 'id="list-' not in status + watched and 'id="nav-running-count"' not in status + watched
    assert f'<i id="list-{live_task.pk}"></i>' in rest and 'id="nav-running-count"' in rest
    assert 'id="detail-' not in rest
    assert 'id="detail-' not in heard["olga list"] and 'id="inbox-' not in heard["olga list"]
    assert f'<u id="inbox-{live_task.pk}"></u>' in heard["amy"]
    assert 'id="list-' not in heard["amy"] and 'id="detail-' not in heard["amy"]
    assert await sockets["ben"].receive_nothing(timeout=QUIET_SECONDS)
    assert renders == {"list": 1, "detail olga": 1, "inbox": 1}
    for communicator in sockets.values():
        await communicator.disconnect()


async def test_the_sockets_of_a_process_are_in_each_group_once_and_a_hub_that_stops_closes_them(
    socket_for, operator, live_task
):
    layer = get_channel_layer()
    sockets = [await socket_for(operator) for _ in range(3)]
    for communicator in sockets:
        await connected(communicator)
    assert len(layer.groups[TASKS_GROUP]) == 1 and len(layer.groups[user_group(operator.pk)]) == 1

    await apply_snapshot(task=live_task, snapshot=snapshot(statusMessage="halfway"))
    for communicator in sockets:
        assert 'id="nav-running-count"' in await communicator.receive_from(timeout=5)
    await sockets[0].disconnect()
    assert len(layer.groups[TASKS_GROUP]) == 1  # the other two are still in it

    hub = hub_for(layer)
    hub._stop(RuntimeError("the channel layer went away"))  # what its reader does when receive fails
    for communicator in sockets[1:]:
        assert await communicator.receive_output(timeout=5) == {"type": "websocket.close", "code": CLOSE_HUB_LOST}
        await communicator.disconnect()


async def test_the_hub_hands_a_change_first_to_the_sockets_watching_its_task():
    """The sockets a change reaches first ask first for their rendering, which the live thread does in turn: the page
    showing the task must not wait behind the list pages' signal and nav counts (bench/freshness.py)."""
    layer = InMemoryChannelLayer()
    hub = Hub(layer)
    handed = []

    class Inbox(asyncio.Queue):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

        def put_nowait(self, item) -> None:
            handed.append(self.name)
            super().put_nowait(item)

    lists = [Inbox(f"list {n}") for n in range(20)]
    detail, other_detail = Inbox("detail"), Inbox("another task's detail")
    approvers_detail = Inbox("an approver's detail")  # not in the tasks group: it hears the task through its own
    task_id, other_task_id = uuid.uuid4(), uuid.uuid4()
    for inbox in [*lists[:10], detail, other_detail, *lists[10:]]:
        await hub.join(TASKS_GROUP, inbox)
    for inbox in (detail, approvers_detail):
        await hub.join(task_group(task_id), inbox)
    await hub.join(task_group(other_task_id), other_detail)
    change = {"type": "task.changed", "task_id": str(task_id), "message_id": "m1"}
    try:
        # publish.py sends a change to each of its groups; here the tasks group's copy comes first.
        await layer.group_send(TASKS_GROUP, {**change, "group": TASKS_GROUP})
        await layer.group_send(task_group(task_id), {**change, "group": task_group(task_id)})
        for inbox in [*lists, detail, other_detail, approvers_detail]:
            assert (await asyncio.wait_for(inbox.get(), 5))["task_id"] == str(task_id)
        assert sorted(handed[:2]) == ["an approver's detail", "detail"]
        assert sorted(handed[2:]) == sorted(["another task's detail", *(inbox.name for inbox in lists)])
        # The task group's copy hands the watchers nothing more: each had the change once.
        await layer.group_send(task_group(other_task_id), {**change, "task_id": str(other_task_id), "message_id": "m2"})
        assert (await asyncio.wait_for(other_detail.get(), 5))["message_id"] == "m2"
        assert detail.empty() and approvers_detail.empty()
    finally:
        for task in (hub._reader, hub._refresher):
            task.cancel()


async def test_the_last_socket_of_a_group_leaving_takes_the_process_out_of_it(socket_for, operator):
    layer = get_channel_layer()
    first, second = await socket_for(operator), await socket_for(operator)
    await connected(first)
    await connected(second)
    await first.disconnect()
    assert TASKS_GROUP in layer.groups
    await second.disconnect()
    pending = list(hub_for(layer)._changes.values())  # the discards, if not done yet
    if pending:
        await asyncio.wait(pending)
    assert TASKS_GROUP not in layer.groups and user_group(operator.pk) not in layer.groups


# --- access that changes while the socket is open ----------------------------------------------------


async def test_a_server_granted_after_connect_is_heard_and_one_revoked_is_not(
    socket_for, django_user_model, server, other_server, operator, task_fragments
):
    task_fragments(FragmentKind.INBOX, lambda task, user: f'<article id="card-{task.pk}"></article>')
    alpha_approvers = await sync_to_async(Group.objects.create)(name="alpha-approvers")
    await sync_to_async(set_approver_groups)(server, [alpha_approvers])
    carl = await sync_to_async(user_in)(django_user_model, "carl", "approvers")
    alpha_task = await database_sync_to_async(launched_on)(server, operator)
    communicator = await socket_for(carl)
    assert 'data-approver="no"></span>' in await connected(communicator)  # no server of his yet

    await sync_to_async(carl.groups.add)(alpha_approvers)
    assert 'data-approver="yes">0</span>' in await communicator.receive_from(timeout=5)
    await apply_snapshot(task=alpha_task, snapshot=snapshot("input_required", inputRequests={"ok": APPROVAL_REQUEST}))
    assert f'<article id="card-{alpha_task.pk}"></article>' in await communicator.receive_from(timeout=5)

    await sync_to_async(alpha_approvers.user_set.remove)(carl)
    assert 'data-approver="no"></span>' in await communicator.receive_from(timeout=5)
    await apply_snapshot(task=alpha_task, snapshot=snapshot("working", statusMessage="answered elsewhere"))
    assert await communicator.receive_nothing(timeout=QUIET_SECONDS)
    await communicator.disconnect()


async def test_a_user_deactivated_after_connect_is_disconnected(socket_for, operator):
    communicator = await socket_for(operator)
    await connected(communicator)
    operator.is_active = False
    await database_sync_to_async(operator.save)()
    closed = await communicator.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": CLOSE_NO_LONGER_ALLOWED}


async def test_a_role_lost_without_a_message_stops_changes_once_the_access_is_read_again(
    socket_for, operator, live_task, monkeypatch
):
    """The access.changed message is at most once; the socket reads the access again at the latest after
    ACCESS_MAX_AGE_SECONDS (here 0) anyway. The membership is deleted by queryset: no signal is sent."""
    communicator = await socket_for(operator)
    await connected(communicator)
    memberships = operator.groups.through.objects.filter(user=operator)
    await database_sync_to_async(memberships.delete)()
    await apply_snapshot(task=live_task, snapshot=snapshot(statusMessage="unseen"))
    assert ">1</span>" in await communicator.receive_from(timeout=5)  # the max age (30 s) was not reached

    monkeypatch.setattr(consumer, "ACCESS_MAX_AGE_SECONDS", 0.0)
    await apply_snapshot(task=live_task, snapshot=snapshot(statusMessage="unseen again"))
    assert await communicator.receive_nothing(timeout=QUIET_SECONDS)
    await communicator.disconnect()


# --- whom a change goes to ------------------------------------------------------------------------------------


def test_a_change_goes_to_the_inbox_only_for_a_task_that_asks_and_a_caller_that_knows_it_asks_no_query(
    live_task, monkeypatch
):
    sent = []
    monkeypatch.setattr(publish, "_send_to_groups", lambda groups, message: sent.append((groups, message["server_id"])))
    everyone = [task_group(live_task.pk), TASKS_GROUP]  # the task's own group first: sent in this order
    publish.publish_task_changed(live_task.pk)  # no input request yet: not the inbox's business
    assert sent[-1] == (everyone, live_task.server_id)
    services.apply_snapshot(task=live_task, snapshot=snapshot("input_required", inputRequests={"ok": APPROVAL_REQUEST}))
    publish.publish_task_changed(live_task.pk)
    asking = ([*everyone, inbox_group(live_task.server_id)], live_task.server_id)
    assert sent[-1] == asking
    # The answer and its delivery hold the request, and say so: the same groups, without looking the task up.
    with CaptureQueriesContext(connection) as asked:
        publish.publish_task_changed(live_task.pk, server_id=live_task.server_id, asks=True)
    assert not asked.captured_queries
    assert sent[-1] == asking


class SendsRecorded(InMemoryChannelLayer):
    """An in-memory layer that records when each group_send begins and ends (a send yields to the loop between)."""

    def __init__(self):
        super().__init__()
        self.sends = []

    async def group_send(self, group, message):
        self.sends.append(("begins", group))
        await asyncio.sleep(0)
        await super().group_send(group, message)
        self.sends.append(("ends", group))


def test_a_change_goes_to_the_tasks_own_group_first_and_to_each_group_after_the_one_before(live_task, monkeypatch):
    """The pages that show the task and the gateway's waits are in its own group, and a process's hub hands them the
    change with its first copy: that copy is sent first, and alone (sent at once, the copies' round trips to Redis
    interleaved and each came later: bench/publish.py)."""
    layer = SendsRecorded()
    monkeypatch.setattr(publish, "get_channel_layer", lambda: layer)
    publish.publish_task_changed(live_task.pk, server_id=live_task.server_id, asks=True)
    groups = [task_group(live_task.pk), TASKS_GROUP, inbox_group(live_task.server_id)]
    assert layer.sends == [(step, group) for group in groups for step in ("begins", "ends")]


# --- publishing never breaks a service ---------------------------------------------------------------


def closed_port_redis_layer() -> RedisChannelLayer:
    return RedisChannelLayer(hosts=[f"redis://127.0.0.1:{free_port()}/0"])


def test_publish_with_redis_down_does_not_raise(live_task, monkeypatch, caplog):
    monkeypatch.setattr(publish, "get_channel_layer", closed_port_redis_layer)
    started = time.monotonic()
    publish.publish_task_changed(live_task.pk)
    assert time.monotonic() - started < publish.SEND_TIMEOUT_SECONDS + 2
    assert "dropped" in caplog.text


def test_a_service_commits_with_redis_down(live_task, monkeypatch):
    monkeypatch.setattr(publish, "get_channel_layer", closed_port_redis_layer)
    assert services.apply_snapshot(task=live_task, snapshot=snapshot(statusMessage="still fine"))
    live_task.refresh_from_db()
    assert live_task.status_message == "still fine"


def test_publish_with_redis_url_at_a_closed_port_in_a_fresh_process():
    """The settings path (REDIS_URL), from a thread with no event loop, without a database row."""
    code = (
        "import threading, uuid, django; django.setup()\n"
        "from taskhub.live import publish\n"
        "publish.audience_of_task = lambda task_id: (['tasks'], 1)\n"
        "errors = []\n"
        "def run():\n"
        "    try: publish.publish_task_changed(uuid.uuid4())\n"
        "    except BaseException as error: errors.append(error)\n"
        "thread = threading.Thread(target=run); thread.start(); thread.join()\n"
        "assert not errors, errors\n"
        "print('ok')\n"
    )
    environment = {
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "PATH": "/usr/bin:/bin",
    }
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT_DIR, env=environment, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_publish_from_async_code_reaches_the_task_group_from_a_thread_without_an_error(live_task, monkeypatch, caplog):
    """From a running loop the publish runs on a thread of its own: an error there would never reach the caller,
    so the test waits for that thread, fails on what it raised or logged, and reads the message it sent."""
    layer = InMemoryChannelLayer()
    monkeypatch.setattr(publish, "get_channel_layer", lambda: layer)

    async def listen_then_publish_from_a_running_loop() -> str:
        channel = await layer.new_channel()
        await layer.group_add(task_group(live_task.pk), channel)
        publish.publish_task_changed(live_task.pk)
        return channel

    raised_on_a_thread = []
    excepthook, threading.excepthook = threading.excepthook, raised_on_a_thread.append
    try:
        channel = asyncio.run(listen_then_publish_from_a_running_loop())
        publish_threads = [thread for thread in threading.enumerate() if thread.name == publish.PUBLISH_THREAD_NAME]
        for thread in publish_threads:
            thread.join(timeout=10)
            assert not thread.is_alive(), "the publish thread did not end"
    finally:
        threading.excepthook = excepthook
    assert not raised_on_a_thread, [hook_args.exc_value for hook_args in raised_on_a_thread]
    assert "dropped" not in caplog.text
    message = asyncio.run(asyncio.wait_for(layer.receive(channel), timeout=5))
    assert message["type"] == publish.TASK_CHANGED and message["task_id"] == str(live_task.pk)


# --- across processes: the Redis layer ---------------------------------------------------------------


async def test_a_change_published_through_one_redis_layer_reaches_a_socket_on_another(
    socket_for, operator, live_task, settings, monkeypatch
):
    if not redis_is_up(LOCAL_REDIS_URL):
        # Outside CI a developer may have no Redis; in CI (.ci/run starts one) a missing Redis is a failure.
        (pytest.fail if os.environ.get("CI") else pytest.skip)("no Redis on 127.0.0.1:6379")
    prefix = f"taskhub-test-{free_port()}"
    config = {"hosts": [LOCAL_REDIS_URL], "prefix": prefix}
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": config}}
    other_process_layer = RedisChannelLayer(**config)  # what a worker process would hold
    monkeypatch.setattr(publish, "get_channel_layer", lambda: other_process_layer)
    communicator = await socket_for(operator)
    try:
        await connected(communicator)
        await apply_snapshot(task=live_task, snapshot=snapshot("completed"))
        assert ">0</span>" in await communicator.receive_from(timeout=5)
        await communicator.disconnect()
    finally:
        # Its connections were opened on the publishing loop (publish.py), and are closed there.
        await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(other_process_layer.flush(), publish._publisher_loop())
        )
