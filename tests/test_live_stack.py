"""Across real processes: a change the worker makes reaches a browser's socket on the web process through Redis."""

import asyncio

import pytest

from taskhub.accounts.groups import ADMINS, OPERATORS
from taskhub.tasks import services
from tests.account_fixtures import make_user
from tests.stack_fixtures import frames_until, running_counts, running_stack, session_cookie_for, went_up_and_down

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_the_workers_changes_reach_a_socket_on_the_web_process():
    admin = make_user("ada", ADMINS)
    operator = make_user("olga", OPERATORS)
    with running_stack(admin) as stack:
        cookie = session_cookie_for(operator)
        socket_url = stack.url.replace("http://", "ws://") + "/ws/live/"

        async def scenario():
            joined = asyncio.Event()

            def joined_then_up_and_down(frames: list[str]) -> bool:
                joined.set()  # the consumer sends the nav counts once it has joined its groups
                return went_up_and_down(frames)

            listening = asyncio.create_task(frames_until(socket_url, cookie, joined_then_up_and_down, timeout=30))
            await asyncio.wait_for(joined.wait(), timeout=30)
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
