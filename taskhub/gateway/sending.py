"""The gateway sends an agent's first tools/call to an HTTP server itself, on a client it keeps (issue 37 item 1).

Through the worker a quick call took the gateway's record, the job's pickup, the worker's reads, a new client's
connection and `server/discover`, the marker's transaction, the call and its record, and the wake of the waiting
request: +48 to +104 ms over calling the server directly (bench/gateway.py), where the server took 2-4. Here the
launch and its `task.launch_sent` marker are one transaction (services.launch_sent_by_gateway), the call goes on a
client already connected, and its outcome is recorded by the same services as the worker's; the request answers as
soon as it is. Durability is the worker's: the task is written, marked sent, before anything is sent; a launch job
deferred past the call's timeout makes the outcome unknown should this process stop before recording it; a server
found gone before the call was sent (a client idle for ASK_AFTER_IDLE_SECONDS asks it first) has the launch handed
to the worker (services.hand_launch_to_worker); once the call may have gone out, a failure leaves it unknown.

Only where nothing of the worker's is needed: an HTTP server (a stdio server's process is one worker's), not
connected through OAuth (its tokens are refreshed under the worker's lock), reachable, enabled, that negotiated the
Tasks extension's revision (a 2025 server may ask its questions inside the call, or run it as a task of its session:
both are held by a worker), a first call (an MRTR retry carries answers the worker delivers), and not past the
server's `max_concurrent_jobs` in this process. Anything else goes through the worker, as before.

The same kept clients send an approver's answer from the inbox (answer_and_send, send_answer): claimed for `web`
in the answer's transaction (services.answer_input's `caller_sends`), sent as it commits, recorded by the delivery
services; should this process stop before it records the send, the worker's sweep hands the answer to the delivery job
once the claim is old (services.hand_over_answers_the_web_left). A server found gone or a claim grown old hands it to
that job unsent, a failure once it may have gone out hands it over with its claim (the job asks the server first).
bench/approval.py: the click to `tasks/update` at the server 27.7 → 18.8 ms p50.

The clients live on a loop of their own, on a thread of their own: a request's loop (daphne's, or one per request
under Django's test client) only waits for the outcome, and its going away (the agent hung up) leaves the call to
finish and be recorded. A server's first call is sent by the worker while its client connects in the background.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction

from taskhub.gateway.waiting import on_gateway_thread
from taskhub.mcp import wire
from taskhub.mcp.client import HttpTarget, TasksClient
from taskhub.mcp.errors import ProtocolError
from taskhub.observability import metrics, tracing
from taskhub.servers.models import Server, Transport
from taskhub.tasks import services
from taskhub.tasks.errors import InvalidTransition
from taskhub.tasks.models import InputRequest, Task
from taskhub.worker.heartbeats import CLAIM_HOLDS_SECONDS, claim_clock
from taskhub.worker.progress import CallProgress
from taskhub.worker.slots import launch_timeout

logger = logging.getLogger(__name__)

# After a client could not connect, or its server spoke another revision, it is tried again after this long.
RECONNECT_AFTER_SECONDS = 30.0
# A client that has heard nothing from its server for this long asks it something (`server/discover`) before a call:
# a server that went away meanwhile (restarted, stopped) is found before the call is sent, and the call goes to the
# worker, never sent twice. Once a call has been sent, a failure cannot be told apart from a call that ran (a kept
# connection carries other calls too): its outcome is unknown, as after the worker's send.
ASK_AFTER_IDLE_SECONDS = 5.0


@dataclass(eq=False)
class KeptClient:
    """One server's client, for calls that declare the Tasks extension or for those that do not."""

    key: tuple[int, bool]  # the server's id, and whether its calls declare the Tasks extension
    target: HttpTarget
    timeout: float
    client: TasksClient | None = None
    ready: bool = False  # connected, and the server speaks the Tasks extension's revision
    retry_at: float = 0.0  # monotonic: when a client that failed is tried again
    in_flight: int = 0
    heard_at: float = 0.0  # monotonic: the server's last answer on this client
    retired: bool = False  # replaced (the server's settings changed): closed once its calls are done
    connecting: bool = False


class Sender:
    """The process's kept clients and their loop (started on first use)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[tuple[int, bool], KeptClient] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sending: set[concurrent.futures.Future] = set()

    # -- on any thread ----------------------------------------------------------------------------------------

    def take(self, server: Server, *, declares_tasks: bool, answer: bool = False) -> KeptClient | None:
        """A kept client ready to send this server's call (or with `answer`, an answer: tasks/update), counted as in
        flight until it is recorded (`send`, `send_answer`) or given back (not sent after all); or None: the worker
        sends it (and a client is connected meanwhile, for the next one)."""
        return self._ready(server, declares_tasks=declares_tasks, answer=answer, take=True)

    def may_send_answer(self, server: Server) -> bool:
        """Whether an answer to this server's task could be sent now on a kept client (nothing is taken; a client is
        connected if none is, for the next answer)."""
        return self._ready(server, declares_tasks=True, answer=True, take=False) is not None

    def _ready(self, server: Server, *, declares_tasks: bool, answer: bool, take: bool) -> KeptClient | None:
        enabled = settings.TASKHUB_WEB_SENDS_ANSWERS if answer else settings.TASKHUB_GATEWAY_SENDS_CALLS
        if not enabled or not _sendable(server):
            return None
        target = server.to_target()
        assert isinstance(target, HttpTarget)
        timeout = launch_timeout(server)
        key = (server.pk, declares_tasks)
        with self._lock:
            kept = self._kept.get(key)
            if kept is None or kept.target != target or kept.timeout != timeout:
                if kept is not None:
                    self._retire(kept)
                kept = self._kept[key] = KeptClient(key=key, target=target, timeout=timeout)
            if not kept.ready:
                if not kept.connecting and time.monotonic() >= kept.retry_at:
                    kept.connecting = True
                    self._on_loop(self._connect(kept))
                return None
            limit = server.max_concurrent_jobs
            if limit is not None and self._in_flight(server.pk) >= limit:
                return None
            if take:
                kept.in_flight += 1
        return kept

    def send_answer(self, input_request: InputRequest, *, claimed_at: float) -> concurrent.futures.Future:
        """Send an answer claimed for the web process (services.answer_input's `caller_sends`; claimed at
        `claimed_at`, by heartbeats.claim_clock) on its server's kept client, and record what came back; with no client
        free now, hand it to the delivery job. The future returned is done once the outcome is recorded."""
        kept = self.take(input_request.task.server, declares_tasks=True, answer=True)
        if kept is None:
            done: concurrent.futures.Future = concurrent.futures.Future()
            done.set_result(services.hand_answer_to_worker(input_request=input_request, sent=False))
            return done
        return self._sent_on_loop(self._send_answer(kept, input_request=input_request, claimed_at=claimed_at))

    def give_back(self, kept: KeptClient) -> None:
        """A taken client not used after all (the gate held the call, or the launch was refused)."""
        self._on_loop(self._release(kept))

    def send(self, kept: KeptClient, *, task: Task, tools: Any) -> concurrent.futures.Future:
        """Send the launched task's call on the kept client and record what came back (`tools`: the server's stored
        catalogue, for the tool's `x-mcp-header` arguments). The future returned is done once the outcome is
        committed (the agent may be answered; its result is the task as recorded, or None) or nothing more will be
        recorded here."""
        told: concurrent.futures.Future = concurrent.futures.Future()
        self._sent_on_loop(self._send(kept, task=task, tools=tools, told=told))
        return told

    def close(self, timeout: float = 10) -> None:
        """Close every kept client and stop the loop (tests; a process that ends needs nothing of it)."""
        with self._lock:
            kept, self._kept = list(self._kept.values()), {}
            loop, self._loop = self._loop, None
        if loop is None:
            return

        concurrent.futures.wait(list(self._sending), timeout=timeout)  # the calls being sent or recorded

        async def close_all() -> None:
            for each in kept:
                if each.client is not None:
                    with contextlib.suppress(Exception):
                        await each.client.aclose()

        asyncio.run_coroutine_threadsafe(close_all(), loop).result(timeout=timeout)
        loop.call_soon_threadsafe(loop.stop)

    def _sent_on_loop(self, sending) -> concurrent.futures.Future:
        """A send on the loop, which close() waits for."""
        future = self._on_loop(sending)
        self._sending.add(future)
        future.add_done_callback(self._sending.discard)
        return future

    def _in_flight(self, server_id: int) -> int:
        return sum(kept.in_flight for (pk, _), kept in self._kept.items() if pk == server_id)

    def _retire(self, kept: KeptClient) -> None:
        """Under the lock: no call takes `kept` any more; it is closed once its calls are done."""
        kept.retired = True
        kept.ready = False
        if self._kept.get(kept.key) is kept:
            del self._kept[kept.key]
        if kept.in_flight == 0 and kept.client is not None:
            self._on_loop(kept.client.aclose())

    def _on_loop(self, coroutine) -> concurrent.futures.Future:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="taskhub-gateway-sender", daemon=True).start()
            self._loop = loop
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    # -- on the sender's loop -----------------------------------------------------------------------------------

    async def _connect(self, kept: KeptClient) -> None:
        client = TasksClient(kept.target, timeout=kept.timeout, declare_tasks=kept.key[1])
        try:
            discovery = await client.discover()
        except Exception as error:
            logger.info("gateway: no kept client for %s (%s); its calls go through the worker", kept.target, error)
            discovery = None
        with self._lock:
            kept.connecting = False
            if discovery is not None and discovery.protocol_version == wire.PROTOCOL_VERSION and not kept.retired:
                kept.client, kept.ready, kept.heard_at = client, True, time.monotonic()
                return
            kept.retry_at = time.monotonic() + RECONNECT_AFTER_SECONDS
        await client.aclose()

    def _give_up(self, kept: KeptClient) -> None:
        """Its connection may be gone: the next calls go through the worker while a new client connects."""
        with self._lock:
            self._retire(kept)

    async def _release(self, kept: KeptClient) -> None:
        with self._lock:
            kept.in_flight -= 1
            close = kept.retired and kept.in_flight == 0 and kept.client is not None
        if close:
            assert kept.client is not None
            await kept.client.aclose()

    async def _send(self, kept: KeptClient, *, task: Task, tools: Any, told: concurrent.futures.Future) -> None:
        try:
            await _call_and_record(kept, task=task, tools=tools, told=told, give_up=self._give_up)
        except Exception:
            # The marker stands: the fallback job makes the outcome unknown, as after a process that stopped.
            logger.exception("gateway: the tools/call of task %s was not recorded", task.pk)
        finally:
            _tell(told)
            await self._release(kept)

    async def _send_answer(self, kept: KeptClient, *, input_request: InputRequest, claimed_at: float) -> None:
        try:
            await _deliver_and_record(kept, input_request=input_request, claimed_at=claimed_at, give_up=self._give_up)
        except Exception:
            # The claim stands: the sweep hands the answer to the delivery job once the claim is old, and the job asks
            # the server whether it arrived, as after a process that stopped.
            logger.exception("the answer to input request %s was not recorded as sent", input_request.pk)
        finally:
            await self._release(kept)


def answer_and_send(*, input_request: InputRequest, **answering) -> InputRequest:
    """services.answer_input in the caller's transaction (`locked`: the request read with
    services.locked_for_answer), and the answer sent on this process's kept client of its server as that transaction
    commits, where it may be (answer_input's `caller_sends`): an approver's answer need not wait for the delivery job
    to be picked up and claim it. Only from a transaction of the caller's own (a view's): under an outer one (a
    test's), or where no client is ready, the delivery job sends it."""
    server = input_request.task.server
    if len(transaction.get_connection().atomic_blocks) != 1 or not SENDER.may_send_answer(server):
        return services.answer_input(input_request=input_request, locked=True, **answering)
    claimed_at = claim_clock()  # before the claim: its age is never underestimated
    answered = services.answer_input(input_request=input_request, locked=True, caller_sends=True, **answering)
    if answered.sent_by_caller:
        sent = copy.copy(answered)  # the caller goes on with its own (the card it shows)
        # Robust: the answer is committed by then; should even handing it over fail, the sweep hands it to the job.
        transaction.on_commit(lambda: _send_with_a_head_start(sent, claimed_at=claimed_at), robust=True)
    return answered


# How long the request's thread stands aside once it has handed the answer to the sender's loop, unless the outcome is
# recorded sooner. Rendering the card, sending the response and the live publishes on daphne's other threads held
# the interpreter meanwhile, and the answer reached the server 4.5-4.9 ms after the loop took it up, where a bare
# client's whole send takes 2.5; standing aside 5 ms: 2.5-2.6 ms, submit → `tasks/update` at the server 18.6 and
# 19.4 → 16.2 and 16.5 ms p50, the approver's card back 20-22 → 28 ms (bench/approval.py, unrecorded, alternating).
SEND_HEAD_START_SECONDS = 0.005


def _send_with_a_head_start(sent: InputRequest, *, claimed_at: float) -> None:
    outcome = SENDER.send_answer(sent, claimed_at=claimed_at)
    concurrent.futures.wait([outcome], timeout=SEND_HEAD_START_SECONDS)


def _sendable(server: Server) -> bool:
    return (
        server.transport == Transport.HTTP
        and not server.oauth
        and server.enabled
        and server.removed_at is None
        and server.unreachable_since is None
    )


async def _call_and_record(
    kept: KeptClient, *, task: Task, tools: Any, told: concurrent.futures.Future, give_up: Callable[[KeptClient], None]
) -> None:
    """tools/call and its outcome recorded, as the worker's launch job records them (jobs._call_and_follow);
    `give_up(kept)` when no answer came."""
    client = kept.client
    assert client is not None
    if (error := await _found_gone(kept, give_up)) is not None:  # nothing was sent: the worker sends it, with retries
        reason = f"The gateway could not reach the server ({error}); the worker sends the call."
        await on_gateway_thread(services.hand_launch_to_worker)(
            task=task, reason=reason[:500], declares_tasks=kept.key[1]
        )
        return
    client.learn_tools(tools)
    progress = CallProgress(task.pk, store=_on_gateway_thread)
    try:
        outcome = await client.call_tool(task.tool, task.arguments, on_progress=progress)
    except ProtocolError as error:
        kept.heard_at = time.monotonic()
        await _record(services.record_launch_failure, told, task=task, error=error.to_error_object(), sent=True)
        return
    except Exception as error:
        give_up(kept)
        logger.warning("gateway: tools/call of task %s: no usable answer (%s)", task.pk, error)
        reason = f"tools/call sent, but no usable answer: {error}"
        await _record(services.mark_launch_unknown, told, task=task, reason=reason)
        return
    finally:
        await progress.aclose()  # its last report stored before the outcome ends the task
    kept.heard_at = time.monotonic()
    await _record(services.record_launch_outcome, told, task=task, outcome=outcome)


async def _found_gone(kept: KeptClient, give_up: Callable[[KeptClient], None]) -> Exception | None:
    """Why the kept client's server no longer answers, asked only once the client has been idle for
    ASK_AFTER_IDLE_SECONDS (None: it answers, or was heard from lately); the client is given up then."""
    if time.monotonic() - kept.heard_at <= ASK_AFTER_IDLE_SECONDS:
        return None
    assert kept.client is not None
    try:
        await kept.client.answers()
    except Exception as error:
        give_up(kept)
        return error
    return None


# The approver's submit goes on in this span: services.answer_input kept its context on the answer, since this loop
# does not run in the context of the thread that hands it the answer.
@tracing.traced("taskhub.answer.send", attributes=tracing.answer_attributes, parent=tracing.answer_context)
async def _deliver_and_record(
    kept: KeptClient, *, input_request: InputRequest, claimed_at: float, give_up: Callable[[KeptClient], None]
) -> None:
    """tasks/update with the answer's key alone, sent only while the web process's claim holds, and what came back
    recorded, as the delivery job sends and records it (jobs._deliver, jobs._send_answer); `give_up(kept)` when no
    answer came."""
    client = kept.client
    assert client is not None
    hand_over = on_gateway_thread(services.hand_answer_to_worker)
    if await _found_gone(kept, give_up) is not None:  # nothing was sent: the delivery job sends it, with its retries
        await hand_over(input_request=input_request, sent=False)
        return
    # A claim holds for CLAIM_HOLDS_SECONDS (see jobs._send_answer): a process paused past it sends nothing.
    if claim_clock() - claimed_at > CLAIM_HOLDS_SECONDS:
        await hand_over(input_request=input_request, sent=False)
        return
    task = input_request.task
    try:
        # As long as the delivery job's wait: an attempt cut off by it has ended before the answer may be sent again
        # (TASKHUB_DELIVERY_SETTLE_SECONDS after the claim), whatever the kept client's own timeout (a call's).
        async with asyncio.timeout(settings.TASKHUB_DELIVERY_TIMEOUT_SECONDS):
            await client.update_task(task.remote_task_id, {input_request.key: input_request.answer})
    except ProtocolError as error:  # refused (the task is gone, the answer rejected): retrying cannot help
        kept.heard_at = time.monotonic()
        await on_gateway_thread(services.record_delivery_failure)(
            input_request=input_request, error=error.to_error_object(), sent_by_web=True
        )
        return
    except Exception as error:  # it may have gone out: the job asks the server before it sends again
        give_up(kept)
        logger.warning("tasks/update for input request %s: no usable answer (%s)", input_request.pk, error)
        await hand_over(input_request=input_request, sent=True)
        return
    kept.heard_at = time.monotonic()
    await on_gateway_thread(services.mark_delivered)(input_request=input_request, sent_by_web=True)
    metrics.answer_delivered(input_request.answered_at)


async def _record(service, told: concurrent.futures.Future, **kwargs) -> None:
    """The outcome recorded by `service`; the agent is told as soon as it commits, while the commit's other hooks
    (the live pages' publish: a query and Redis; the launcher's mail) still run."""
    with contextlib.suppress(InvalidTransition):  # cancelled or ended meanwhile: what it is stands
        tell = functools.partial(_tell, told)
        await on_gateway_thread(committed_first)(tell, service, **kwargs, sent_by_gateway=True)


async def _on_gateway_thread(function, **kwargs):
    return await on_gateway_thread(function)(**kwargs)


def committed_first[R](then: Callable[[R], object], service: Callable[..., R], **kwargs) -> R:
    """`service(**kwargs)` in a transaction whose first commit hook is `then(its result)`: it runs as soon as the
    change is committed, before the hooks the service adds. `service` is a service whose body is its transaction
    (`@transaction.atomic`): the body runs in this one, which it opens, rather than in a savepoint of it (two round
    trips to Postgres less; an error rolls the whole back either way)."""
    body = service.__wrapped__  # what @transaction.atomic wraps (functools.wraps)
    done: list[R] = []
    with transaction.atomic():
        transaction.on_commit(lambda: then(done[0]))
        done.append(body(**kwargs))
    return done[0]


def _tell(told: concurrent.futures.Future, recorded: object = None) -> None:
    """The agent may be answered: with the task as recorded, when the outcome service returned it."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        told.set_result(recorded if isinstance(recorded, Task) else None)


SENDER = Sender()
