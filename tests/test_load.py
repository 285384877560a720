"""Load: many live tasks followed by worker processes while browser-like sockets watch and approvers answer.

Everything is real: the demo MCP server over HTTP (its /demo/stats counts every tasks/update per task and
key), two `manage.py worker` processes, daphne on the Redis channel layer, Postgres. WebSocket clients
connect to /ws/live/ with an operator's session cookie and a same-site Origin, as the task list page does;
approvers read their inbox page and answer each card with an htmx POST carrying the CSRF token from the
page's hx-headers, as the browser does. Some requests are answered by two approvers at the same moment.

Asserted: every answer reached the server exactly once, and it is the winning approver's; of each double
submit exactly one approver was told "answered by you" and the other who won; every task's status in the
database is the server's; every socket heard changes of many tasks and was never closed or in error.
Printed (not asserted): throughput, answer→delivery latency, socket frames.

    uv run pytest tests/test_load.py -s                            # CI size
    TASKHUB_LOAD_SCALE=full uv run pytest tests/test_load.py -s    # issue 7's size: 1,000 / 50 / 10 / 500

The flood case (issue 14): one server with thousands of open requests (1,200 at CI size, 4,000 full) and three of
another; the three are on the first page of the inbox and of GET /api/inbox, and both answer in time.
"""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
import pytest
from django.conf import settings
from django.db import connection

from taskhub.accounts.groups import ADMINS, APPROVERS, OPERATORS
from taskhub.audit.models import AuditEvent
from taskhub.mcp.client import HttpTarget, TasksClient
from taskhub.servers.services import create_server, update_server
from taskhub.tasks import services
from taskhub.tasks.models import InputRequest, InputRequestState, Task
from tests.account_fixtures import make_user
from tests.approval_fixtures import add_approver_groups
from tests.catalogue_fixtures import with_tools
from tests.helpers import let_time_pass_async, wait_until
from tests.hostile_server import HostileServer, Silence
from tests.stack_fixtures import running_stack, session_cookie_for, worker_log

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@dataclass(frozen=True)
class Scale:
    tasks: int
    clients: int
    approvers: int
    requests: int
    double_every: int  # every n-th request is answered by two approvers at once
    timeout_s: float
    flood: int  # open requests of one server in the flood case (issue 14, point 4)


SCALES = {
    "ci": Scale(tasks=120, clients=10, approvers=4, requests=60, double_every=10, timeout_s=300, flood=1200),
    "full": Scale(tasks=1000, clients=50, approvers=10, requests=500, double_every=10, timeout_s=900, flood=4000),
}
SCALE_ENV = "TASKHUB_LOAD_SCALE"
# The tasks that do not ask: most report progress (a change every few seconds), a few fail.
PROGRESS = {"steps": 4, "step_ms": 5000}
FAIL_EVERY = 10
DECLINE_EVERY = 7
INBOX_POLL_S = 0.5
# launch_unknown: the answer to tools/call was lost (it may have run), so taskhub says it does not know; it never
# resends. A loaded machine loses a few such answers; more than this share fails the test.
SETTLED = ("completed", "failed", "cancelled", "launch_unknown")
UNKNOWN_SHARE = 0.02
# After the last task ended, the sockets may still be catching up (each change is rendered per connection).
QUIET_S = 10.0
DRAIN_TIMEOUT_S = 180.0
SIGNAL = re.compile(r'<template id="tasks-live-signal"[^>]*data-task="([0-9a-f-]+)" data-status="(\w+)"')
CSRF_HEADER = re.compile(r"hx-headers='\{&quot;X-CSRFToken&quot;: &quot;([^&]+)&quot;\}'|\"X-CSRFToken\": \"([^\"]+)\"")
# (type, name) of each answer field of a card: a textarea (a long text field) has no type and counts as text.
FIELD = re.compile(r'<(input|select|textarea)\b[^>]*?(?:type="(\w+)"[^>]*?)?name="(f:[^"]+)"')


def answer_fields(card: str) -> list[tuple[str, str]]:
    return [(kind or ("text" if tag == "textarea" else tag), name) for tag, kind, name in FIELD.findall(card)]


def tool_for(n: int, size: Scale) -> tuple[str, dict]:
    if n < size.requests:
        return "approval", {"action": f"release {n}"}
    if n % FAIL_EVERY == 0:
        return "fail", {}
    return "progress", PROGRESS


def scale() -> Scale:
    name = os.environ.get(SCALE_ENV, "ci")
    if name not in SCALES:
        raise pytest.UsageError(f"{SCALE_ENV} must be one of {sorted(SCALES)}, not {name!r}")
    return SCALES[name]


# --- what the clients saw ------------------------------------------------------------------------------


@dataclass
class SocketLog:
    frames: int = 0
    last_frame_at: float = 0.0
    heard: dict[str, set[str]] = field(default_factory=dict)  # task id -> statuses signalled
    closed_early: str = ""


@dataclass
class Submission:
    request_id: int
    approver: str
    action: str
    reason: str
    status: int
    outcome: str  # won | lost | other
    seconds: float


@dataclass
class LoadRun:
    sockets: list[SocketLog]
    submissions: list[Submission] = field(default_factory=list)
    answered: set[int] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    inbox_failures: list[int] = field(default_factory=list)  # statuses of inbox reads that failed (retried)


async def watch_the_list(url: str, cookie: str, log: SocketLog, connected: asyncio.Event, stop: asyncio.Event):
    origin = url.replace("ws://", "http://").removesuffix("/ws/live/")
    try:
        async with (
            aiohttp.ClientSession(cookies={settings.SESSION_COOKIE_NAME: cookie}) as session,
            session.ws_connect(url, origin=origin, heartbeat=None) as socket,
        ):
            receiving = asyncio.ensure_future(socket.receive())
            stopping = asyncio.ensure_future(stop.wait())
            while True:
                done, _ = await asyncio.wait({receiving, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if stopping in done:
                    receiving.cancel()
                    return
                message = receiving.result()
                if message.type != aiohttp.WSMsgType.TEXT:
                    log.closed_early = f"{message.type.name} {socket.close_code} {message.extra!r}"
                    stopping.cancel()
                    return
                log.frames += 1
                log.last_frame_at = time.monotonic()
                connected.set()  # the first frame (nav counts) comes once the socket joined its groups
                for task_id, status in SIGNAL.findall(message.data):
                    log.heard.setdefault(task_id, set()).add(status)
                receiving = asyncio.ensure_future(socket.receive())
    except Exception as error:
        log.closed_early = f"{type(error).__name__}: {error}"
        connected.set()


class Approver:
    """One signed-in person with an inbox page open: reads its cards and answers through the page's forms."""

    def __init__(self, base_url: str, username: str, cookie: str, run: LoadRun) -> None:
        self.run = run
        self.base_url = base_url
        self.username = username
        jar = aiohttp.CookieJar(unsafe=True)  # cookies for 127.0.0.1
        self.session = aiohttp.ClientSession(cookie_jar=jar, cookies={settings.SESSION_COOKIE_NAME: cookie})
        self.csrf_token = ""

    async def open_cards(self) -> dict[int, list[tuple[str, str]]]:
        """The open cards of the inbox (a full page first, then the live re-fetch), with their form fields."""
        fragment = "?fragment=cards" if self.csrf_token else ""
        async with self.session.get(f"{self.base_url}/inbox/{fragment}", headers=self._htmx(bool(fragment))) as r:
            if r.status >= 500:  # e.g. Postgres out of connections on a shared machine: read again, as htmx would
                self.run.inbox_failures.append(r.status)
                return {}
            assert r.status == 200, (self.username, r.status)
            page = await r.text()
        if not self.csrf_token:
            match = CSRF_HEADER.search(page)
            assert match, "the inbox page carries its CSRF token in hx-headers"
            self.csrf_token = html.unescape(match.group(1) or match.group(2))
        cards = {}
        for chunk in page.split('<article class="ir-card')[1:]:
            state = re.search(r'data-state="(\w+)" data-request="(\d+)"', chunk)
            if state and state.group(1) == "open":
                cards[int(state.group(2))] = answer_fields(chunk.split("</article>", 1)[0])
        return cards

    async def answer(self, request_id: int, fields: list[tuple[str, str]], action: str) -> Submission:
        reason = f"{self.username} answers {request_id}"
        data = {"action": action}
        if action == "accept":
            for kind, name in fields:
                data[name] = "true" if kind == "checkbox" else reason
        headers = {**self._htmx(True), "X-CSRFToken": self.csrf_token, "Origin": self.base_url}
        started = time.monotonic()
        async with self.session.post(f"{self.base_url}/inbox/{request_id}/answer", data=data, headers=headers) as r:
            card = await r.text()
            status = r.status
        if "answered by you" in card:
            outcome = "won"
        elif "answered this first; your answer was not recorded" in card:
            outcome = "lost"
        else:
            outcome = "other"
        return Submission(request_id, self.username, action, reason, status, outcome, time.monotonic() - started)

    def _htmx(self, htmx: bool) -> dict[str, str]:
        return {"HX-Request": "true"} if htmx else {}

    async def close(self) -> None:
        await self.session.close()


def action_for(request_id: int) -> str:
    return "decline" if request_id % DECLINE_EVERY == 0 else "accept"


async def answer_everything(approvers: list[Approver], run: LoadRun, size: Scale, deadline: float, stop) -> None:
    """Each approver answers the cards that fall to it; every `double_every`-th card two approvers at once."""
    count = len(approvers)
    # request id -> the n-th request seen by any approver, which decides who answers it (n % count) and whether two
    # do at once; all approvers run on one event loop, so this needs no lock.
    order: dict[int, int] = {}

    async def answer_one(approver: Approver, request_id: int, fields) -> None:
        n = order.setdefault(request_id, len(order))
        if n % count != approvers.index(approver) or request_id in run.answered:
            return
        run.answered.add(request_id)
        if n % size.double_every == 0:
            partner = approvers[(n + 1) % count]
            both = await asyncio.gather(
                approver.answer(request_id, fields, action_for(request_id)),
                partner.answer(request_id, fields, action_for(request_id)),
            )
            run.submissions.extend(both)
        else:
            run.submissions.append(await approver.answer(request_id, fields, action_for(request_id)))

    async def keep_answering(approver: Approver) -> None:
        while len(run.answered) < size.requests and time.monotonic() < deadline and not stop.is_set():
            cards = await approver.open_cards()
            for request_id in sorted(cards):
                await answer_one(approver, request_id, cards[request_id])
            await let_time_pass_async(INBOX_POLL_S, because="an approver reads the inbox again at this pace")

    await asyncio.gather(*(keep_answering(approver) for approver in approvers))


def run_load(
    run: LoadRun, stack_url: str, cookies: list[str], approver_cookies: dict[str, str], size: Scale, started, stop
):
    """In a thread of its own: the sockets until `stop`, and the approvers until every request is answered."""
    sockets = run.sockets

    async def main():
        stopping = asyncio.Event()
        connected = [asyncio.Event() for _ in cookies]
        socket_url = stack_url.replace("http://", "ws://") + "/ws/live/"
        watchers = [
            asyncio.create_task(watch_the_list(socket_url, cookie, log, event, stopping))
            for cookie, log, event in zip(cookies, sockets, connected, strict=True)
        ]
        await asyncio.wait_for(asyncio.gather(*(event.wait() for event in connected)), 60)
        started.set()
        approvers = [Approver(stack_url, name, cookie, run) for name, cookie in approver_cookies.items()]
        try:
            await answer_everything(approvers, run, size, time.monotonic() + size.timeout_s, stop)
        except Exception as error:
            run.errors.append(f"approvers: {type(error).__name__}: {error}")
        finally:
            for approver in approvers:
                await approver.close()
        await asyncio.to_thread(stop.wait)
        stopping.set()
        await asyncio.gather(*watchers)

    try:
        asyncio.run(main())
    except Exception as error:
        run.errors.append(f"{type(error).__name__}: {error}")
        started.set()


# --- the server's truth ---------------------------------------------------------------------------------


def demo_stats(demo_url: str) -> dict:
    with urllib.request.urlopen(demo_url.removesuffix("/mcp") + "/demo/stats", timeout=30) as response:
        return json.load(response)


def server_statuses(demo_url: str, remote_ids: list[str]) -> dict[str, str]:
    async def read():
        async with TasksClient(HttpTarget(url=demo_url)) as client:
            return {remote_id: (await client.get_task(remote_id)).status for remote_id in remote_ids}

    return asyncio.run(read())


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))] if ordered else float("nan")


def job_timings() -> dict[str, dict[str, list[float]]]:
    """Per job kind: seconds each job waited in the queue (deferred -> started) and ran (started -> succeeded)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT job.task_name, event.job_id, event.type, event.at FROM procrastinate_events event"
            " JOIN procrastinate_jobs job ON job.id = event.job_id"
        )
        events: dict[tuple[str, int], dict[str, object]] = {}
        for name, job_id, kind, at in cursor.fetchall():
            events.setdefault((name, job_id), {})[kind] = at
    timings: dict[str, dict[str, list[float]]] = {}
    for (name, _), at in events.items():
        kind = timings.setdefault(name.removeprefix("taskhub."), {"wait": [], "run": []})
        if "deferred" in at and "started" in at:
            kind["wait"].append((at["started"] - at["deferred"]).total_seconds())
        if "started" in at and "succeeded" in at:
            kind["run"].append((at["succeeded"] - at["started"]).total_seconds())
    return timings


def wait_until_sockets_are_quiet(sockets: list[SocketLog], timeout: float) -> float:
    """Every socket heard nothing for QUIET_S: what daphne still had queued for them has arrived."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if all(time.monotonic() - log.last_frame_at >= QUIET_S for log in sockets):
            return time.monotonic() - started - QUIET_S
        time.sleep(0.5)
    return time.monotonic() - started


def wait_for_all_terminal(task_ids: list, timeout: float, run: LoadRun) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        live = Task.objects.filter(pk__in=task_ids).exclude(status__in=SETTLED).count()
        if live == 0:
            return time.monotonic() - started
        time.sleep(1)
    counts = Counter(Task.objects.filter(pk__in=task_ids).values_list("status", flat=True))
    raise AssertionError(f"not every task ended within {timeout:g} s: {dict(counts)}; load errors: {run.errors}")


# --- the test -------------------------------------------------------------------------------------------


def test_live_tasks_watched_by_many_sockets_while_approvers_answer_through_the_pages(capsys):
    size = scale()
    admin = make_user("ada", ADMINS)
    operators = [make_user(f"watcher{n}", OPERATORS) for n in range(size.clients)]
    approvers = [make_user(f"approver{n}", APPROVERS) for n in range(size.approvers)]
    with running_stack(admin, "--poll-interval-ms", "2000") as stack:
        stack.workers.start(f"load-second-{stack.demo.port}")
        started, stop = threading.Event(), threading.Event()
        run = LoadRun(sockets=[SocketLog() for _ in operators])
        load = threading.Thread(
            target=run_load,
            args=(
                run,
                stack.url,
                [session_cookie_for(user) for user in operators],
                {user.username: session_cookie_for(user) for user in approvers},
                size,
                started,
                stop,
            ),
            daemon=True,
        )
        load.start()
        try:
            assert started.wait(90), "the sockets did not connect"
            began = time.monotonic()
            tasks = [
                services.launch(server=stack.server, tool=tool, arguments=arguments, user=operators[0])
                for tool, arguments in (tool_for(n, size) for n in range(size.tasks))
            ]
            launched_s = time.monotonic() - began
            ended_s = wait_for_all_terminal([t.pk for t in tasks], size.timeout_s, run) + launched_s
            drained_s = wait_until_sockets_are_quiet(run.sockets, DRAIN_TIMEOUT_S)
        finally:
            stop.set()
            load.join(60)
        stats = demo_stats(stack.demo.url)
        tasks = list(Task.objects.filter(pk__in=[t.pk for t in tasks]))
        truth = server_statuses(stack.demo.url, [t.remote_task_id for t in tasks if t.remote_task_id])
        logs = [
            stack.web.log_path,
            *(worker_log(name) for name in stack.workers.processes),
        ]
        over_capacity = sum(path.read_text().count("over capacity") for path in logs)
        jobs = job_timings()
    assert not load.is_alive() and not run.errors, run.errors

    unknown = [t for t in tasks if t.status == "launch_unknown"]
    assert len(unknown) <= UNKNOWN_SHARE * size.tasks, f"{len(unknown)} launches with a lost answer"
    launched = [t for t in tasks if t.status != "launch_unknown"]

    # Every request answered once, by the approver whose click won, and delivered to the server exactly once.
    requests = {ir.pk: ir for ir in InputRequest.objects.filter(task__in=tasks).select_related("task", "answered_by")}
    assert len(requests) == sum(1 for t in launched if t.tool == "approval")
    assert run.answered == set(requests)
    assert {ir.state for ir in requests.values()} == {InputRequestState.DELIVERED}
    deliveries = {
        f"{ir.task.remote_task_id}/{ir.key}": stats["deliveries"].get(f"{ir.task.remote_task_id}/{ir.key}")
        for ir in requests.values()
    }
    assert set(deliveries.values()) == {1}, Counter(deliveries.values())
    answered_events = Counter(
        AuditEvent.objects.filter(action="input.answered", task_id__in=[t.pk for t in tasks]).values_list(
            "task_id", flat=True
        )
    )
    assert set(answered_events.values()) == {1} and len(answered_events) == len(requests)

    by_request: dict[int, list[Submission]] = {}
    for submission in run.submissions:
        by_request.setdefault(submission.request_id, []).append(submission)
    doubles = [subs for subs in by_request.values() if len(subs) == 2]
    assert len(doubles) == len(range(0, len(requests), size.double_every))
    for request_id, subs in by_request.items():
        winners = [s for s in subs if s.outcome == "won"]
        assert len(winners) == 1 and all(s.status == 200 for s in subs), subs
        assert all(s.outcome == "lost" for s in subs if s is not winners[0]), subs
        request = requests[request_id]
        assert request.answered_by.username == winners[0].approver
        text = request.task.result["content"][0]["text"]
        if winners[0].action == "accept":
            assert text == f"approved: {request.task.arguments['action']} (reason: {winners[0].reason})"
        else:
            assert text == "declined"

    # Every task ends as its server says it ended, which is what its tool does.
    mismatched = {
        t.remote_task_id: (t.status, truth[t.remote_task_id]) for t in launched if t.status != truth[t.remote_task_id]
    }
    assert not mismatched
    assert all(t.status == ("failed" if t.tool == "fail" else "completed") for t in launched)

    # Every socket stayed open and heard changes of tasks. Not of every task: the live socket is at-most-once by
    # design (a page re-syncs on reconnect, and the list re-fetches on any signal); under this load a busy consumer
    # falls behind and the channel layer drops what its queues cannot hold (the figures are printed below).
    for n, log in enumerate(run.sockets):
        assert not log.closed_early, (n, log.closed_early)
        assert log.heard, f"socket {n} heard no task change in {log.frames} frames"

    latencies = [(ir.delivered_at - ir.answered_at).total_seconds() for ir in requests.values()]
    posts = [s.seconds for s in run.submissions]
    frames = [log.frames for log in run.sockets]
    heard = [len(log.heard) for log in run.sockets]
    ends = [sum(1 for statuses in log.heard.values() if statuses & {"completed", "failed"}) for log in run.sockets]
    report = [
        f"load test ({os.environ.get(SCALE_ENV, 'ci')}): {size.tasks} tasks, {size.clients} sockets, "
        f"{size.approvers} approvers, {size.requests} requests ({len(doubles)} answered twice at once), 2 workers",
        f"  launched in {launched_s:.1f} s; all ended after {ended_s:.1f} s: "
        f"{size.tasks / ended_s:.1f} tasks/s, {len(requests) / ended_s:.1f} answers/s",
        f"  answer->delivery (answered_at -> delivered_at): p50 {percentile(latencies, 0.5) * 1000:.0f} ms, "
        f"p95 {percentile(latencies, 0.95) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms",
        f"  answer POST round trip: p50 {percentile(posts, 0.5) * 1000:.0f} ms, "
        f"p95 {percentile(posts, 0.95) * 1000:.0f} ms",
        f"  sockets still receiving after the last task ended: for {drained_s:.1f} s more\n"
        f"  socket frames: {sum(frames)} in all, per socket min {min(frames)} / median {percentile(frames, 0.5):.0f}"
        f" / max {max(frames)}; tasks heard per socket min {min(heard)} / median {percentile(heard, 0.5):.0f}"
        f" of {size.tasks}, of whose end min {min(ends)} / median {percentile(ends, 0.5):.0f}; group sends that found"
        f" a socket's channel full: {over_capacity}",
        f"  server polls: {sum(stats['polls'].values())}, deliveries: {sum(stats['deliveries'].values())}; "
        f"launches whose answer was lost (launch_unknown): {len(unknown)}; inbox reads that failed: "
        f"{len(run.inbox_failures)} {sorted(set(run.inbox_failures))}",
        *(
            f"  {name} jobs: {len(times['run'])}, queue wait p50 {percentile(times['wait'], 0.5):.1f} s"
            f" / p95 {percentile(times['wait'], 0.95):.1f} s, run p50 {percentile(times['run'], 0.5):.1f} s"
            f" / p95 {percentile(times['run'], 0.95):.1f} s"
            for name, times in sorted(jobs.items())
            if name in ("launch_task", "deliver_answer")
        ),
        f"  load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
    ]
    with capsys.disabled():
        print("\n" + "\n".join(report))


def test_a_flood_of_one_servers_requests_does_not_bury_another_servers_few(capsys):
    from django.contrib.auth.models import Group
    from django.test import Client

    from taskhub.api.tokens import create_token
    from taskhub.mcp.client import TaskCreated
    from taskhub.servers.services import create_server
    from tests.catalogue_fixtures import with_tools
    from tests.helpers import snapshot

    size = scale()
    approver = make_user("ada", APPROVERS, "team")
    team = Group.objects.get(name="team")
    flooder, quiet = (
        create_server(name=name, transport="http", url=f"http://{name}.example/mcp", user=None)
        for name in ("flooder", "quiet")
    )
    add_approver_groups(flooder, team)
    add_approver_groups(quiet, team)
    ask = {"method": "elicitation/create", "params": {"message": "Refund?", "requestedSchema": {"type": "object"}}}

    def task_asking(server, keys):
        task = services.launch(server=with_tools(server, "refund"), tool="refund", arguments={}, user=None)
        created = TaskCreated(task=snapshot(task_id=f"r-{task.id}"))
        task = services.record_launch_outcome(task=task, outcome=created)
        asking = snapshot("input_required", task_id=f"r-{task.id}", inputRequests=dict.fromkeys(keys, ask))
        services.apply_snapshot(task=task, snapshot=asking)
        return task

    flood_task = task_asking(flooder, ["k0"])
    InputRequest.objects.bulk_create(
        InputRequest(task=flood_task, server=flooder, key=f"k{n}", method="elicitation/create", params=ask["params"])
        for n in range(1, size.flood)
    )
    few = sorted(
        InputRequest.objects.filter(task__in=[task_asking(quiet, [f"q{n}"]) for n in range(3)]).values_list(
            "pk", flat=True
        )
    )

    pages = Client()
    pages.force_login(approver)
    began = time.monotonic()
    page = pages.get("/inbox/").content.decode()
    page_s = time.monotonic() - began
    _, secret = create_token(user=approver, name="load")
    began = time.monotonic()
    body = Client(headers={"Authorization": f"Bearer {secret}"}).get("/api/inbox").json()
    api_s = time.monotonic() - began

    assert [int(pk) for pk in re.findall(r'id="ir-(\d+)"', page)] == few
    assert f"{size.flood} open requests from <strong>flooder</strong>" in page
    assert [row["id"] for row in body["results"]] == few
    assert body["grouped"] == [{"server": "flooder", "server_id": flooder.pk, "count": size.flood}]
    with capsys.disabled():
        print(f"\nflood of {size.flood}: inbox page {page_s * 1000:.0f} ms, /api/inbox {api_s * 1000:.0f} ms")


# --- a slow server among others (issue 14) --------------------------------------------------------------------------

SLOW_LAUNCHES = 20  # as many as the worker has slots (`manage.py worker` runs 20 jobs at once by default)
SLOW_CALL_TIMEOUT_S = 60


def test_a_server_whose_tool_never_answers_does_not_hold_back_the_other_servers(workers, shared_demo_server):
    """Issue 14: 20 launches of a tool that never answers held all 20 job slots of a worker for the launch timeout;
    another server's answer was delivered after 117 s. Now the slow server holds its share (a quarter): the other
    servers' answer and launch go out within seconds, in a real worker process."""
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_periodic_defers; DELETE FROM procrastinate_jobs")
    operator, approver = make_user("olga", OPERATORS), make_user("abe", APPROVERS)
    with HostileServer() as silent:
        silent.tool("never", Silence())
        slow = create_server(name="slow", transport="http", url=silent.url, user=None)
        slow = update_server(server=with_tools(slow, "never"), user=None, call_timeout_seconds=SLOW_CALL_TIMEOUT_S)
        answers = with_tools(
            create_server(name="answers", transport="http", url=shared_demo_server.url, user=None), "approval"
        )
        third = with_tools(
            create_server(name="third", transport="http", url=shared_demo_server.url, user=None), "quick"
        )
        workers.start(f"slow-server-{silent.port}", "--shutdown-timeout", "1")

        waiting = services.launch(server=answers, tool="approval", arguments={"action": "ship"}, user=operator)
        approve = wait_until(
            lambda: InputRequest.objects.filter(task=waiting, key="approve").first(), what="the approval", timeout=60
        )
        slow_launches = [
            services.launch(server=slow, tool="never", arguments={}, user=operator) for _ in range(SLOW_LAUNCHES)
        ]
        wait_until(lambda: len(silent.tool_calls) >= 5, what="the slow server's share of calls", timeout=30)
        wait_until(lambda: not due_launches(), what="the worker to get past the slow server's launches", timeout=15)
        began = time.monotonic()
        services.answer_input(input_request=approve, response={"action": "decline"}, user=approver)
        quick = services.launch(server=third, tool="quick", arguments={"text": "not starved"}, user=operator)
        wait_until(
            lambda: InputRequest.objects.get(pk=approve.pk).state == InputRequestState.DELIVERED,
            what="the other server's answer",
            timeout=SLOW_CALL_TIMEOUT_S,
        )
        delivered_s = time.monotonic() - began
        wait_until(lambda: Task.objects.get(pk=quick.pk).status == "completed", what="the third launch", timeout=30)
        started_s = time.monotonic() - began
        calls = len(silent.tool_calls)
        workers.stop_all()
    # Not starved: both went while the slow server's launches still held their slots (no timed bound: bench/'s).
    assert calls == 5  # a quarter of the worker's 20 slots, one tools/call each
    assert Task.objects.filter(pk__in=[t.pk for t in slow_launches], status="launching").count() == SLOW_LAUNCHES
    print(f"\nslow server: answer delivered after {delivered_s:.1f} s, third launch done after {started_s:.1f} s")


def due_launches() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo' AND task_name = 'taskhub.launch_task'"
            " AND (scheduled_at IS NULL OR scheduled_at <= now())"
        )
        return cursor.fetchone()[0]
