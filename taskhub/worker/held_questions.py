"""The worker's side of held questions (taskhub/tasks/services/held_questions.py): a question a server asks on the
session of a call this worker holds open (a classic `elicitation/create`) is put to people as an input request, and
its answer, once given, is sent back as the JSON-RPC response on that session.

`asker_for(task, worker_id)` is what the launch job passes to `TasksClient.call_tool`. Its wait for the answer is
woken by Postgres (`LISTEN`, `HeldAnswers`: the answering service NOTIFYs in its transaction), with a look at the
row every `SAFETY_POLL_SECONDS` should a notification be missed (the listening connection dropped), and ends at the
request's `held_until` ("cancel" is sent, the card says why) or when the call ends first (it got its result, or
failed: the question closes as lost, and so it does when the session's handler is cancelled). A URL-mode question the
server says was completed at its link (`notifications/elicitation/complete`) before anyone answered it closes with
that reason and the server hears "accept".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from typing import Any

import psycopg
from asgiref.sync import sync_to_async
from django.utils import timezone

from taskhub.database.params import database_params
from taskhub.mcp.questions import Asker, Question
from taskhub.tasks import hooks
from taskhub.tasks.models import InputRequestState, Task
from taskhub.tasks.services import held_questions
from taskhub.worker.orm import db

logger = logging.getLogger(__name__)

SAFETY_POLL_SECONDS = 2.0
RECONNECT_SECONDS = 2.0
CANCELLED = {"action": "cancel"}
ACCEPTED = {"action": "accept"}


# Per event loop, as the gateway's SafetyNet keeps its own: an entry goes with its loop.
_held_answers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, HeldAnswers] = weakref.WeakKeyDictionary()


class HeldAnswers:
    """One LISTEN connection per event loop, opened with the first question it waits for; wakes its waiter."""

    @staticmethod
    def of_this_loop() -> HeldAnswers:
        loop = asyncio.get_running_loop()
        held = _held_answers.get(loop)
        if held is None:
            held = _held_answers[loop] = HeldAnswers()
        return held

    def __init__(self) -> None:
        self._waiters: dict[int, asyncio.Event] = {}
        self._listening: asyncio.Task | None = None

    async def wait(self, input_request_id: int, timeout: float, *, or_until: tuple[asyncio.Event, ...]) -> None:
        """Until the request's answer is notified, one of `or_until` is set, or `timeout` passes (whichever first)."""
        if self._listening is None or self._listening.done():
            self._listening = asyncio.create_task(self._listen(), name="held answers")
        event = self._waiters.setdefault(input_request_id, asyncio.Event())
        waits = [asyncio.ensure_future(waited.wait()) for waited in (event, *or_until)]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
            event.clear()

    def forget(self, input_request_id: int) -> None:
        self._waiters.pop(input_request_id, None)
        if not self._waiters and self._listening is not None:
            self._listening.cancel()
            self._listening = None

    async def _listen(self) -> None:
        while True:
            try:
                params = await sync_to_async(database_params)()
                async with await psycopg.AsyncConnection.connect(autocommit=True, **params) as connection:
                    await connection.execute(f"LISTEN {hooks.HELD_ANSWERS_CHANNEL}")
                    async for notice in connection.notifies():
                        with contextlib.suppress(ValueError):
                            if (event := self._waiters.get(int(notice.payload))) is not None:
                                event.set()
            except asyncio.CancelledError:
                raise
            except Exception as error:
                logger.warning("listening for the answers to held questions failed (%s); again in a moment", error)
            await asyncio.sleep(RECONNECT_SECONDS)


def asker_for(task: Task, *, worker_id: str) -> Asker:
    """The `asker` of `task`'s tools/call: each question becomes an input request held by this worker."""

    async def ask(question: Question) -> dict[str, Any]:
        opened = await db(
            held_questions.open_held_question,
            task_id=task.pk,
            method=question.method,
            params=question.params,
            server_request_id=question.server_request_id,
            held_by=worker_id,
        )
        if opened is None:
            return CANCELLED
        return await _answer_of(opened.pk, question=question)

    return ask


async def _answer_of(input_request_id: int, *, question: Question) -> dict[str, Any]:
    held = HeldAnswers.of_this_loop()
    call_ended, completed_at_link = question.call_ended, question.completed_at_link
    try:
        while True:
            request = await db(held_questions.held_question, input_request_id=input_request_id)
            if call_ended.is_set():
                reason = held_questions.CALL_ENDED
                await db(held_questions.close_held_question, input_request_id=input_request_id, reason=reason)
                return CANCELLED
            if request.state == InputRequestState.ANSWERED:
                if await db(held_questions.record_held_answer_sent, input_request_id=input_request_id):
                    return request.answer
                return CANCELLED  # closed meanwhile (its worker taken for dead): the server hears "cancel"
            if request.state != InputRequestState.OPEN:
                return CANCELLED
            if completed_at_link.is_set():  # done at its link before anyone answered here: the person consented
                if await db(held_questions.close_completed_at_link, input_request_id=input_request_id):
                    return ACCEPTED
                continue  # answered meanwhile: that answer goes
            left = (request.held_until - timezone.now()).total_seconds() if request.held_until else 0.0
            if left <= 0:
                reason = held_questions.WAIT_RAN_OUT.format(wait=_duration(request))
                await db(held_questions.close_held_question, input_request_id=input_request_id, reason=reason)
                return CANCELLED
            waits = (call_ended,) if completed_at_link.is_set() else (call_ended, completed_at_link)
            await held.wait(input_request_id, min(left, SAFETY_POLL_SECONDS), or_until=waits)
    except asyncio.CancelledError:
        # The call ended first (or the worker stops): the question can no longer be answered. Shielded, so that the
        # cancellation itself cannot cut the record short.
        closing = db(
            held_questions.close_held_question, input_request_id=input_request_id, reason=held_questions.CALL_ENDED
        )
        with contextlib.suppress(Exception):
            await asyncio.shield(closing)
        raise
    finally:
        held.forget(input_request_id)


def _duration(request) -> str:
    seconds = round((request.held_until - request.created_at).total_seconds())
    return f"{seconds // 60} min" if seconds >= 120 else f"{seconds} s"
