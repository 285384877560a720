"""Production mode as the README documents it: DEBUG off, SECRET_KEY, static files collected and served by
WhiteNoise, two daphne processes sharing live updates through Redis, and a worker, all on one Postgres, as the
application's own database role (taskhub/database/roles.py: it may not change the audit trail)."""

import asyncio
import re
import urllib.request

import aiohttp
import pytest
from django.db import connection

from taskhub.accounts.groups import ADMINS, APPROVERS, OPERATORS
from taskhub.api.tokens import create_token
from taskhub.audit.models import AuditEvent
from taskhub.tasks.models import InputRequest, InputRequestState, Task
from tests.account_fixtures import make_user
from tests.browser_fixtures import running_daphne
from tests.demo_process import DemoServer
from tests.helpers import wait_until
from tests.stack_fixtures import (
    Workers,
    api_request,
    production_environment,
    register_and_discover,
    session_cookie_for,
    worker_environment,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def production_env(tmp_path, application_role):
    return production_environment(tmp_path / "static", DATABASE_URL=application_role.url)


def connected_roles() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT DISTINCT usename FROM pg_stat_activity WHERE datname = current_database()")
        return {row[0] for row in cursor.fetchall()}


def test_an_answer_posted_to_one_web_process_reaches_a_socket_on_the_other(
    production_env,
    settings,
    application_role,
):
    settings.SECRET_KEY = production_env["SECRET_KEY"]  # the session made here must be valid in daphne
    admin = make_user("ada", ADMINS)
    operator = make_user("olga", OPERATORS)
    approver = make_user("arun", APPROVERS)
    _, operator_token = create_token(user=operator, name="test")
    _, approver_token = create_token(user=approver, name="test")

    with DemoServer("--poll-interval-ms", "200") as demo:
        server = register_and_discover(demo, admin)
        workers = Workers(worker_environment(**production_env))
        try:
            workers.start("prod")
            with running_daphne(**production_env) as web_a, running_daphne(**production_env) as web_b:
                # Static files come from WhiteNoise with hashed names: DEBUG is off.
                page = urllib.request.urlopen(f"{web_a.url}/accounts/login/", timeout=10).read().decode()
                stylesheet = re.search(r'href="(/static/taskhub/taskhub\.[0-9a-f]{12}\.css)"', page)
                assert stylesheet, page[:600]
                assert urllib.request.urlopen(f"{web_a.url}{stylesheet.group(1)}").status == 200

                status, task = api_request(
                    "POST", f"{web_b.url}/api/tasks", operator_token, {"server": server.name, "tool": "approval"}
                )
                assert status == 201, task
                request = wait_until(
                    lambda: InputRequest.objects.filter(task_id=task["id"]).first(), what="the question"
                )

                cookie = session_cookie_for(approver)
                socket_url = web_a.url.replace("http://", "ws://") + "/ws/live/"

                async def listen_on_a_then_answer_on_b() -> list[str]:
                    frames: list[str] = []
                    async with (
                        aiohttp.ClientSession(cookies={settings.SESSION_COOKIE_NAME: cookie}) as session,
                        session.ws_connect(socket_url, origin=web_a.url) as socket,
                    ):
                        frames.append((await socket.receive(timeout=10)).data)  # connected: the nav counts
                        answered = asyncio.to_thread(
                            api_request,
                            "POST",
                            f"{web_b.url}/api/input-requests/{request.pk}/answer",
                            approver_token,
                            {"action": "accept", "content": {"approved": True, "reason": "ship it"}},
                        )
                        status, body = await answered
                        assert status == 200, body
                        async with asyncio.timeout(15):
                            while not any(f'id="ir-{request.pk}"' in frame for frame in frames):
                                frames.append((await socket.receive()).data)
                    return frames

                frames = asyncio.run(listen_on_a_then_answer_on_b())
                card = next(frame for frame in frames if f'id="ir-{request.pk}"' in frame)
                assert "answered by" in card or "delivered" in card
                wait_until(lambda: Task.objects.get(pk=task["id"]).status == "completed", what="completion")
                assert application_role.name in connected_roles()
        finally:
            workers.stop_all()
    request.refresh_from_db()
    assert request.state == InputRequestState.DELIVERED
    assert Task.objects.get(pk=task["id"]).result["content"][0]["text"] == "approved: deploy (reason: ship it)"
    # Written by the web processes and the worker, as the application's role.
    trail = set(AuditEvent.objects.filter(task_id=task["id"]).values_list("action", flat=True))
    assert {"task.launched", "input.answered", "input.delivered", "task.status_changed"} <= trail, trail
