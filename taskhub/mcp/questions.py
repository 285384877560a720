"""Questions a server asks in the middle of a call, the way of the 2025-06-18 and 2025-11-25 revisions: a
server→client `elicitation/create` request on the session of a `tools/call` that is still waiting for its result.

`TasksClient.call_tool(..., asker=…)` hands each such question to `asker` (an async function of a `Question`,
returning the `ElicitResult` to answer with, as a dict) and keeps the call open meanwhile: its timeout does not run
while a question waits for its answer (`PausableDeadline`); the asker bounds its own wait.

Which call asks: the server's request names no call on the wire (over stdio nothing relates them; over HTTP only the
event stream it came on), except a 2025-11-25 task's question, which names its task (`related-task`) and goes to the
`tasks/result` of that task. So a question goes to the one call with an asker in flight on the client; with none it is
declined (nobody is there to answer: the CLI without answers, the tracker's clients), and with several it is
declined too, with a log line saying why, rather than shown to a person as another call's question. taskhub's
launch clients of HTTP servers carry one call each; a stdio server's process carries every call on it, so a
question asked while two calls on one process wait is declined. A task's `tasks/result` waiting beside one call does
not make that call's question ambiguous: the task's own questions name it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import mcp_types
from pydantic import ValidationError

logger = logging.getLogger(__name__)
server_log = logging.getLogger("taskhub.mcp.server_log")

RELATED_TASK_META_KEY = "io.modelcontextprotocol/related-task"

ELICITATION = "elicitation/create"
SAMPLING = "sampling/createMessage"
# What a client answers a sampling request its person refused with (the spec's example: -1, "User rejected …").
SAMPLING_REFUSED = -1


@dataclass(frozen=True)
class Question:
    method: str
    params: dict[str, Any]  # as sent, untrusted
    server_request_id: str | int
    # Set once the call that asks has its answer or failed: nobody waits for this question's answer any more.
    call_ended: asyncio.Event
    # Set when the server says the interaction at a URL-mode question's link completed
    # (`notifications/elicitation/complete` naming its `elicitationId`): the person did what was asked there.
    completed_at_link: asyncio.Event = field(default_factory=asyncio.Event)


Asker = Callable[[Question], Awaitable[dict[str, Any]]]
# What a call does with the lines the server logs while it is in flight (`notifications/message`): level, logger,
# data, each as sent (untrusted).
LogSink = Callable[[str, str | None, Any], None]


class PausableDeadline:
    """A request's timeout that stops while a question of its call waits for a person."""

    def __init__(self, seconds: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._left = seconds
        self._deadline: float | None = self._loop.time() + seconds
        self._pauses = 0
        self.changed = asyncio.Event()

    def remaining(self) -> float | None:
        """Seconds until the deadline; None while paused."""
        return None if self._deadline is None else max(0.0, self._deadline - self._loop.time())

    def pause(self) -> None:
        if self._pauses == 0 and self._deadline is not None:
            self._left = max(0.0, self._deadline - self._loop.time())
            self._deadline = None
        self._pauses += 1
        self.changed.set()

    def resume(self) -> None:
        self._pauses -= 1
        if self._pauses == 0:
            self._deadline = self._loop.time() + self._left
        self.changed.set()


@dataclass
class _AskingCall:
    asker: Asker
    deadline: PausableDeadline
    ended: asyncio.Event
    related_task: str | None = None
    on_log: LogSink | None = None


class Questions:
    """The calls of one client that may be asked, and the SDK's elicitation callback that routes to them."""

    def __init__(self, describe: Callable[[], str]) -> None:
        self._describe = describe
        self._calls: dict[int, _AskingCall] = {}
        self._links: dict[str, asyncio.Event] = {}  # URL-mode questions waiting, by elicitationId

    def open(
        self,
        asker: Asker,
        deadline: PausableDeadline,
        *,
        related_task: str | None = None,
        on_log: LogSink | None = None,
    ) -> int:
        """`related_task`: a 2025-11-25 task whose `tasks/result` this is; its questions name it. `on_log`: where the
        lines the server logs go while this is the call in flight."""
        token = id(deadline)
        self._calls[token] = _AskingCall(asker, deadline, asyncio.Event(), related_task, on_log)
        return token

    def close(self, token: int) -> None:
        call = self._calls.pop(token, None)
        if call is not None:
            call.ended.set()

    async def on_elicitation(self, context: Any, params: Any) -> mcp_types.ElicitResult:
        """The SDK's elicitation callback (registering one is also what makes the SDK declare form and URL
        elicitation at `initialize`)."""
        answer = await self._route(ELICITATION, context, params)
        if answer is None:
            return mcp_types.ElicitResult(action="decline")
        try:
            return mcp_types.ElicitResult.model_validate(answer)
        except ValidationError:
            logger.warning("%s: the answer to its question does not fit; answered as cancelled", self._describe())
            return mcp_types.ElicitResult(action="cancel")

    async def on_sampling(self, context: Any, params: Any) -> mcp_types.CreateMessageResult | mcp_types.ErrorData:
        """The SDK's sampling callback: a person writes the message the model would (or refuses: an error)."""
        answer = await self._route(SAMPLING, context, params)
        if answer is None or answer.get("action") in ("decline", "cancel"):
            return mcp_types.ErrorData(code=SAMPLING_REFUSED, message="The person asked refused this sampling request")
        try:
            return mcp_types.CreateMessageResult.model_validate(answer)
        except ValidationError:
            logger.warning("%s: the reply to its sampling request does not fit; refused", self._describe())
            return mcp_types.ErrorData(code=SAMPLING_REFUSED, message="No usable reply was written")

    async def on_log(self, params: Any) -> None:
        """The SDK's logging callback: a line goes to the call it names (its related task) or to the one call in
        flight; otherwise to taskhub's own log (the server logged between calls, or over several)."""
        raw = params.model_dump(by_alias=True, mode="json", exclude_none=True) if hasattr(params, "model_dump") else {}
        level, logger_name, data = str(raw.get("level", "info")), raw.get("logger"), raw.get("data")
        related = _related_task(raw)
        calls = [call for call in self._calls.values() if call.on_log is not None]
        named = [call for call in calls if related is not None and call.related_task == related]
        target = named[0] if named else (calls[0] if len(calls) == 1 else None)
        if target is not None and target.on_log is not None:
            try:
                target.on_log(level, logger_name if isinstance(logger_name, str) else None, data)
            except Exception:  # a line lost is no reason to break the session
                logger.exception("%s: keeping a line it logged failed", self._describe())
            return
        server_log.info("%s logged (%s): %r", self._describe(), level[:20], str(data)[:500])

    def on_elicitation_complete(self, elicitation_id: str) -> None:
        """`notifications/elicitation/complete`: the URL-mode question it names is done with at its link."""
        completed = self._links.get(elicitation_id)
        if completed is None:  # answered already, or never asked here: nothing waits for it
            logger.info("%s: an elicitation completed that no open question waits for", self._describe())
            return
        completed.set()

    async def _route(self, method: str, context: Any, params: Any) -> dict[str, Any] | None:
        """The answer of the call's asker the request goes to; None when it goes to none (see the module's doc)."""
        raw = params.model_dump(by_alias=True, mode="json", exclude_none=True) if hasattr(params, "model_dump") else {}
        related = _related_task(raw)
        named = [call for call in self._calls.values() if related is not None and call.related_task == related]
        if named:
            return await self._ask(named[0], method, raw, context)
        # A 2025-11-25 task's questions name it, so one that names nothing is a call's; a sloppy server's untagged
        # question still reaches a task's tasks/result when that is all that waits.
        calls = [call for call in self._calls.values() if call.related_task is None] or list(self._calls.values())
        if len(calls) != 1:
            if calls:
                logger.warning(
                    "%s asked a question (%s) while %d calls wait on it: it names none of them, so it was refused",
                    self._describe(),
                    method,
                    len(calls),
                )
            return None
        return await self._ask(calls[0], method, raw, context)

    async def _ask(self, call: _AskingCall, method: str, raw: dict[str, Any], context: Any) -> dict[str, Any]:
        server_request_id = getattr(context, "request_id", "")
        question = Question(method=method, params=raw, server_request_id=server_request_id, call_ended=call.ended)
        link_id = raw.get("elicitationId") if method == ELICITATION and raw.get("mode") == "url" else None
        if isinstance(link_id, str):
            self._links[link_id] = question.completed_at_link
        call.deadline.pause()
        try:
            answer = await call.asker(question)
            return answer if isinstance(answer, dict) else {"action": "cancel"}
        except Exception:
            logger.exception("%s: asking its question failed; answered as cancelled", self._describe())
            return {"action": "cancel"}
        finally:
            call.deadline.resume()
            if isinstance(link_id, str):
                self._links.pop(link_id, None)


def _related_task(params: dict[str, Any]) -> str | None:
    """The 2025-11-25 task a question is about (`_meta["io.modelcontextprotocol/related-task"].taskId`), if named."""
    meta = params.get("_meta")
    related = meta.get(RELATED_TASK_META_KEY) if isinstance(meta, dict) else None
    task_id = related.get("taskId") if isinstance(related, dict) else None
    return task_id if isinstance(task_id, str) else None
