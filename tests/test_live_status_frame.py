"""The watched task's status, read and rendered on the event loop (taskhub.live.consumer): the same task as the live
thread reads, the same HTML as a thread renders, and no statement but the read."""

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.db import DatabaseError
from django.utils import timezone

from taskhub.database import pooled
from taskhub.live import consumer
from taskhub.live.access import current_access
from taskhub.live.fragments import FragmentKind
from taskhub.servers.models import Server
from taskhub.tasks import services
from taskhub.tasks.models import Task, TaskPoll
from tests.helpers import snapshot
from tests.test_live import live_task, operator, server  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_layer")]


def values_of(instance) -> dict:
    return {field.attname: getattr(instance, field.attname) for field in type(instance)._meta.concrete_fields}


def as_the_thread_reads(task: Task) -> list:
    """The task's own values and its related rows' (as read with it), and `asks`."""
    related = [task.server, task.launched_by, task.cancel_requested_by]
    poll = task.poll if TaskPoll.objects.filter(task_id=task.pk).exists() else None
    return [values_of(task), *(values_of(row) if row is not None else None for row in [*related, poll]), task.asks]


def as_the_loop_reads(task: Task) -> list:
    related = [task.server, task.launched_by, task.cancel_requested_by]
    poll = task.poll if hasattr(task, "_state") and task._state.fields_cache.get("poll") is not None else None
    return [values_of(task), *(values_of(row) if row is not None else None for row in [*related, poll]), task.asks]


async def test_the_task_read_on_the_event_loop_is_the_one_the_live_thread_reads(live_task, operator):  # noqa: F811
    await sync_to_async(TaskPoll.objects.update_or_create)(task=live_task, defaults={"next_poll_at": timezone.now()})
    await sync_to_async(services.request_cancel)(task=live_task, user=operator)
    on_the_loop = await consumer._read_task_on_loop(str(live_task.pk))
    on_a_thread = await sync_to_async(consumer._task_or_none)(live_task.pk)
    assert isinstance(on_the_loop.server, Server) and isinstance(on_the_loop.launched_by, get_user_model())
    assert on_the_loop.cancel_requested_by is not None and on_the_loop.poll.next_poll_at is not None
    assert as_the_loop_reads(on_the_loop) == await sync_to_async(as_the_thread_reads)(on_a_thread)
    assert await consumer._read_task_on_loop("not a task id") is None
    assert await consumer._read_task_on_loop("00000000-0000-4000-8000-000000000000") is None


async def test_the_watched_tasks_status_renders_on_the_event_loop_as_on_a_thread(live_task, operator):  # noqa: F811
    await sync_to_async(services.apply_snapshot)(
        task=live_task,
        snapshot=snapshot(statusMessage="half <b>way</b>"),
    )
    user, access = await sync_to_async(current_access)(operator.pk)
    # The status's parts, as the socket's first frame has them (consumer._change_frames).
    parts = [part for part in consumer._parts_of_change([FragmentKind.TASK_STATUS]) if part[0] is not None]
    assert parts  # the detail page's status is registered
    task = await consumer._read_task_on_loop(str(live_task.pk))
    # On the loop itself: a statement there would raise (Django refuses to run one in async code), and the fragment
    # would come out empty.
    on_the_loop = consumer._render_parts(task, parts, user, access, language="en")
    on_a_thread = await sync_to_async(consumer._render_parts)(task, parts, user, access, language="en")
    assert on_the_loop == on_a_thread
    html = "".join(on_the_loop)
    assert f'id="task-{live_task.pk}-header"' in html and "half &lt;b&gt;way&lt;/b&gt;" in html


async def test_a_read_the_loops_pool_cannot_make_is_made_on_a_live_thread(live_task, monkeypatch):  # noqa: F811
    async def refused(statement, params):
        raise DatabaseError("the pool's connection broke")

    monkeypatch.setattr(pooled, "fetch_one_prepared", refused)
    read = await consumer._read_task_on_loop(str(live_task.pk))
    assert read is not None and read.pk == live_task.pk and read.server.pk == live_task.server_id


async def test_a_changes_other_renderings_wait_for_its_watched_statuses_then_nothing_is_kept():
    loop = asyncio.get_running_loop()
    first, second = consumer._StatusPending("change-1"), consumer._StatusPending("change-1")
    waiting = asyncio.create_task(consumer._statuses_sent("change-1"))
    await asyncio.sleep(0)
    first.sent()
    first.sent()  # once only
    await asyncio.sleep(0)
    assert not waiting.done()  # the second tab's status is not sent yet
    second.sent()
    await waiting
    assert "change-1" not in consumer._pending_statuses[loop]
    await consumer._statuses_sent("change-2")  # nothing pending: no wait
    consumer._StatusPending("change-3")  # never sent (its socket went away): the others wait a moment, not forever
    await consumer._statuses_sent("change-3")
