"""The task engine: creates tasks, derives their state from the store and the scripts, and tells watchers.

State changes are observed, not driven: `refresh` evaluates a task's script at the current time and records
the phase when it differs from the stored one. Requests refresh the task they touch; the ticker refreshes
tasks whose script announced a change time, so watchers hear about changes when they happen.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import anyio

from taskhub.demo.scripts import SCRIPTS, Facts, Phase, Question, cancelled
from taskhub.demo.store import TaskRow, TaskStore
from taskhub.demo.wire import INPUT_REQUIRED, iso_time

logger = logging.getLogger(__name__)

TICK_CEILING = 1.0  # the ticker looks at least this often, for expiry and purging
PURGE_GRACE = 600.0  # expired tasks answer "expired" for this long before they are deleted


class TaskNotFound(Exception):
    pass


class TaskExpired(Exception):
    pass


class NeedsInput(Exception):
    """Raised by a synchronous run of a script that stops to ask for input."""


@dataclass(frozen=True)
class TaskView:
    """A task as the wire shows it at one moment."""

    task_id: str
    created_at: float
    last_updated_at: float
    ttl_ms: int | None
    poll_interval_ms: int
    phase: Phase

    @property
    def status(self) -> str:
        return self.phase.status

    @property
    def input_requests(self) -> Mapping[str, Question]:
        return self.phase.input_requests

    def to_wire(self) -> dict[str, Any]:
        """The DetailedTask fields (no `resultType`): the body of tasks/get and of notifications/tasks."""
        task: dict[str, Any] = {
            "taskId": self.task_id,
            "status": self.phase.status,
            "createdAt": iso_time(self.created_at),
            "lastUpdatedAt": iso_time(self.last_updated_at),
            "ttlMs": self.ttl_ms,
            "pollIntervalMs": self.poll_interval_ms,
        }
        if self.phase.message is not None:
            task["statusMessage"] = self.phase.message
        if self.phase.status == INPUT_REQUIRED:
            task["inputRequests"] = {key: question.to_wire() for key, question in self.phase.input_requests.items()}
        if self.phase.result is not None:
            task["result"] = dict(self.phase.result)
        if self.phase.error is not None:
            task["error"] = dict(self.phase.error)
        return task

    def create_task_result(self) -> dict[str, Any]:
        """The flat CreateTaskResult: Task fields only, never result/error/inputRequests/requestState."""
        task = {key: value for key, value in self.to_wire().items() if key not in ("inputRequests", "result", "error")}
        return {"resultType": "task", **task}


Watcher = Callable[[str, "TaskView | None"], None]
"""Called with (task_id, view) on every observable change, and (task_id, None) when the task expired."""


@dataclass
class UpdateOutcome:
    accepted: list[str] = field(default_factory=list)  # stored now
    issued: list[str] = field(default_factory=list)  # keys this task has asked, answered before or now


def _changed(row: TaskRow, phase: Phase) -> bool:
    """Whether `phase` differs from the stored one in anything a client can see."""
    seen = (row.status, row.status_message, row.input_keys, row.result, row.error)
    return seen != (phase.status, phase.message, tuple(phase.input_requests), phase.result, phase.error)


class TaskEngine:
    def __init__(
        self, store: TaskStore, *, poll_interval_ms: int, ttl_ms: int | None, clock: Callable[[], float] = time.time
    ) -> None:
        self._store = store
        self._poll_interval_ms = poll_interval_ms
        self._ttl_ms = ttl_ms
        self._clock = clock
        self._watchers: dict[str, dict[object, Watcher]] = {}
        self._wake = anyio.Event()

    # --- lifecycle of a task ------------------------------------------------------------------------------------

    def create(self, tool: str, args: Mapping[str, Any]) -> TaskView:
        """Store a new task and return it; a tasks/get for its id resolves as soon as this returns."""
        script = SCRIPTS[tool]
        now = self._clock()
        task_id = secrets.token_urlsafe(18)
        phase = script(Facts(task_id, args, now), now)
        row = TaskRow(
            task_id=task_id,
            tool=tool,
            args=dict(args),
            created_at=now,
            ttl_ms=self._ttl_ms,
            poll_interval_ms=self._poll_interval_ms,
            cancel_requested_at=None,
            status=phase.status,
            status_message=phase.message,
            input_keys=tuple(phase.input_requests),
            result=phase.result,
            error=phase.error,
            last_updated_at=now,
            next_check_at=phase.next_change_at,
        )
        self._store.insert(row)
        self._wake.set()
        return self._view(row, replace(phase, since=now))

    def exists(self, task_id: str) -> bool:
        return self._store.load(task_id) is not None

    def get(self, task_id: str) -> TaskView:
        """The task as it is now. Raises TaskNotFound or TaskExpired."""
        return self.refresh(task_id)

    def update(self, task_id: str, responses: Mapping[str, Mapping[str, Any]]) -> UpdateOutcome:
        """Store answers to outstanding input requests; other keys are ignored, silently.

        Raises ValueError naming the first outstanding key whose response is malformed (nothing is stored then).
        """
        view = self.refresh(task_id)
        outstanding = view.input_requests
        kept: dict[str, dict[str, Any]] = {}
        for key, response in responses.items():
            if key not in outstanding:
                continue
            if (problem := outstanding[key].problem_with(response)) is not None:
                raise ValueError(f"inputResponses[{key!r}]: {problem}")
            kept[key] = outstanding[key].kept_part(response)
        answered_before = self._store.answers(task_id)
        accepted = self._store.add_answers(task_id, kept, set(outstanding), self._clock())
        if accepted:
            self.refresh(task_id)
        issued = [key for key in responses if key in outstanding or key in answered_before]
        return UpdateOutcome(accepted=accepted, issued=issued)

    def cancel(self, task_id: str) -> None:
        """Ask the task to stop; a terminal task is left as it is (the ack is the same)."""
        view = self.refresh(task_id)
        if not view.phase.terminal:
            self._store.request_cancel(task_id, self._clock())
            self.refresh(task_id)

    def refresh(self, task_id: str) -> TaskView:
        """Evaluate the task's script now, record the phase if it changed, and tell watchers."""
        now = self._clock()
        row = self._store.load(task_id)
        if row is None:
            raise TaskNotFound(task_id)
        if row.expired(now):
            raise TaskExpired(task_id)
        if row.terminal:
            return self._view(row, row.stored_phase())
        phase = self._current_phase(row, now)
        if not _changed(row, phase):
            if row.next_check_at != phase.next_change_at:
                self._store.set_next_check(task_id, phase.next_change_at)
            return TaskView(row.task_id, row.created_at, row.last_updated_at, row.ttl_ms, row.poll_interval_ms, phase)
        # A phase may have begun before we observed it; lastUpdatedAt never goes backwards nor into the future.
        phase = replace(phase, since=min(max(phase.since, row.last_updated_at), now))
        if not self._store.save_phase(task_id, phase, phase.next_change_at):
            return self.refresh(task_id)  # it ended meanwhile; report the stored terminal phase
        view = self._view(row, phase)
        self._publish(task_id, view)
        self._wake.set()  # the ticker may be sleeping past this phase's next change
        return view

    def _current_phase(self, row: TaskRow, now: float) -> Phase:
        facts = Facts(row.task_id, row.args, row.created_at, self._store.answers(row.task_id))
        script = SCRIPTS[row.tool]
        if row.cancel_requested_at is None:
            return script(facts, now)
        phase = script(facts, min(now, row.cancel_requested_at))
        return phase if phase.terminal else cancelled(row.cancel_requested_at)

    @staticmethod
    def _view(row: TaskRow, phase: Phase) -> TaskView:
        return TaskView(row.task_id, row.created_at, phase.since, row.ttl_ms, row.poll_interval_ms, phase)

    # --- synchronous execution for clients without the extension ---------------------------------------------

    async def run_inline(self, tool: str, args: Mapping[str, Any]) -> Phase:
        """Run a tool's script to its end in real time without storing a task (the synchronous path)."""
        script = SCRIPTS[tool]
        facts = Facts("inline", args, self._clock())
        while True:
            phase = script(facts, self._clock())
            if phase.terminal:
                return phase
            if phase.next_change_at is None:
                raise NeedsInput(tool)
            await anyio.sleep(max(0.0, phase.next_change_at - self._clock()))

    # --- watchers and the ticker --------------------------------------------------------------------------------

    def watch(self, task_ids: list[str], watcher: Watcher) -> Callable[[], None]:
        token = object()
        for task_id in task_ids:
            self._watchers.setdefault(task_id, {})[token] = watcher

        def unwatch() -> None:
            for task_id in task_ids:
                watchers = self._watchers.get(task_id, {})
                watchers.pop(token, None)
                if not watchers:
                    self._watchers.pop(task_id, None)

        return unwatch

    def _publish(self, task_id: str, view: TaskView | None) -> None:
        for watcher in list(self._watchers.get(task_id, {}).values()):
            try:
                watcher(task_id, view)
            except Exception:  # one broken watcher must not stop the others or the request
                logger.exception("task watcher raised")

    async def run_ticker(self) -> None:
        """Refresh tasks when their scripts say they change; expire and purge tasks past their TTL."""
        while True:
            try:
                delay = self._tick()
            except Exception:  # e.g. the database is locked by another process: try again shortly
                logger.exception("task ticker failed")
                delay = TICK_CEILING
            self._wake = anyio.Event()
            with anyio.move_on_after(delay):
                await self._wake.wait()

    def _tick(self) -> float:
        """Refresh what is due; return how long the ticker may sleep."""
        now = self._clock()
        for task_id in self._store.due(now):
            self._refresh_quietly(task_id)
        for task_id in list(self._watchers):
            self._refresh_quietly(task_id)  # reports expiry of watched tasks
        self._store.purge_expired(now - PURGE_GRACE)
        next_check = self._store.next_check_at()
        return TICK_CEILING if next_check is None else min(TICK_CEILING, max(0.0, next_check - self._clock()))

    def _refresh_quietly(self, task_id: str) -> None:
        try:
            self.refresh(task_id)
        except (TaskNotFound, TaskExpired):
            self._store.set_next_check(task_id, None)
            self._publish(task_id, None)
        except Exception:  # one broken task must not stop the ticker, which every other task relies on
            logger.exception("refreshing task %s failed", task_id)
            self._store.set_next_check(task_id, None)
