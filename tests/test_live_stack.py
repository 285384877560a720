"""Across real processes: a change the worker makes reaches a browser's socket on the web process through Redis."""

import asyncio

import aiohttp
import pytest
from account_fixtures import make_user
from django.conf import settings
from stack_fixtures import running_stack, session_cookie_for

from taskhub.accounts.groups import ADMINS, OPERATORS
from taskhub.tasks import services

RUNNING_COUNT = 'aria-label="running tasks">'

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def running_counts(frames: list[str]) -> list[str]:
    return [frame.split(RUNNING_COUNT, 1)[1].split("<", 1)[0] for frame in frames if RUNNING_COUNT in frame]


def went_up_and_down(frames: list[str]) -> bool:
    counts = running_counts(frames)
    return "1" in counts and counts[-1] == "0" and counts.index("1") < len(counts) - 1


async def frames_until(url: str, cookie: str, done, *, timeout: float) -> list[str]:
    frames: list[str] = []
    async with (
        aiohttp.ClientSession(cookies={settings.SESSION_COOKIE_NAME: cookie}) as session,
        session.ws_connect(url, origin=url.replace("ws://", "http://").removesuffix("/ws/live/")) as socket,
    ):
        async with asyncio.timeout(timeout):
            async for message in socket:
                frames.append(message.data)
                if done(frames):
                    return frames
    return frames


def test_the_workers_changes_reach_a_socket_on_the_web_process():
    admin = make_user("ada", ADMINS)
    operator = make_user("olga", OPERATORS)
    with running_stack(admin) as stack:
        cookie = session_cookie_for(operator)
        socket_url = stack.url.replace("http://", "ws://") + "/ws/live/"

        async def scenario():
            listening = asyncio.create_task(frames_until(socket_url, cookie, went_up_and_down, timeout=30))
            await asyncio.sleep(1)  # connected and joined before the change
            task = await asyncio.to_thread(
                services.launch,
                server=stack.server,
                tool="progress",
                arguments={"steps": 2, "step_ms": 200},
                user=operator,
            )
            return task, await listening

        task, frames = asyncio.run(scenario())
    task.refresh_from_db()
    assert task.status == "completed"
    # The count of running tasks went up and down again: both changes were made in the worker process.
    assert went_up_and_down(frames), running_counts(frames)
