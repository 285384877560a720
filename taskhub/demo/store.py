"""SQLite persistence of demo tasks (stdlib `sqlite3`).

Two tables: `tasks` holds each task's immutable facts (tool, arguments, creation time, TTL, poll interval),
the cancel request if any, and the last phase the server observed; `answers` holds every accepted input
response. Everything runs on the event loop thread, so each method is atomic within the process; writes that
must not race across processes (answers, phase changes) are additionally guarded in SQL.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from taskhub.demo.scripts import Answer, Phase
from taskhub.demo.wire import TERMINAL_STATUSES

SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    task_id             TEXT PRIMARY KEY,
    tool                TEXT NOT NULL,
    args                TEXT NOT NULL,
    created_at          REAL NOT NULL,
    ttl_ms              INTEGER,
    poll_interval_ms    INTEGER NOT NULL,
    cancel_requested_at REAL,
    status              TEXT NOT NULL,
    status_message      TEXT,
    input_keys          TEXT NOT NULL DEFAULT '[]',
    result              TEXT,
    error               TEXT,
    last_updated_at     REAL NOT NULL,
    next_check_at       REAL
);
CREATE INDEX IF NOT EXISTS tasks_next_check ON tasks (next_check_at) WHERE next_check_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS answers (
    task_id     TEXT NOT NULL REFERENCES tasks (task_id) ON DELETE CASCADE,
    key         TEXT NOT NULL,
    response    TEXT NOT NULL,
    answered_at REAL NOT NULL,
    PRIMARY KEY (task_id, key)
);
"""

_TERMINAL_SQL = ", ".join(f"'{status}'" for status in sorted(TERMINAL_STATUSES))


@dataclass(frozen=True)
class TaskRow:
    task_id: str
    tool: str
    args: Mapping[str, Any]
    created_at: float
    ttl_ms: int | None
    poll_interval_ms: int
    cancel_requested_at: float | None
    status: str
    status_message: str | None
    input_keys: tuple[str, ...]
    result: Mapping[str, Any] | None
    error: Mapping[str, Any] | None
    last_updated_at: float
    next_check_at: float | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def expired(self, now: float) -> bool:
        return self.ttl_ms is not None and now >= self.created_at + self.ttl_ms / 1000

    def stored_phase(self) -> Phase:
        """The last observed phase, as stored (used for terminal tasks, which never change again)."""
        return Phase(self.status, self.last_updated_at, self.status_message, result=self.result, error=self.error)


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


class TaskStore:
    def __init__(self, path: str) -> None:
        # isolation_level=None: autocommit, with explicit BEGIN IMMEDIATE where a read-check-write must be atomic.
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA foreign_keys = ON")
        if path != ":memory:":
            self._db.execute("PRAGMA journal_mode = WAL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def insert(self, row: TaskRow) -> None:
        self._db.execute(
            "INSERT INTO tasks (task_id, tool, args, created_at, ttl_ms, poll_interval_ms, status, status_message,"
            " input_keys, result, error, last_updated_at, next_check_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                row.task_id,
                row.tool,
                _dumps(dict(row.args)),
                row.created_at,
                row.ttl_ms,
                row.poll_interval_ms,
                row.status,
                row.status_message,
                _dumps(list(row.input_keys)),
                _dumps(row.result),
                _dumps(row.error),
                row.last_updated_at,
                row.next_check_at,
            ),
        )

    def load(self, task_id: str) -> TaskRow | None:
        found = self._db.execute("SELECT * FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        if found is None:
            return None
        return TaskRow(
            task_id=found["task_id"],
            tool=found["tool"],
            args=json.loads(found["args"]),
            created_at=found["created_at"],
            ttl_ms=found["ttl_ms"],
            poll_interval_ms=found["poll_interval_ms"],
            cancel_requested_at=found["cancel_requested_at"],
            status=found["status"],
            status_message=found["status_message"],
            input_keys=tuple(json.loads(found["input_keys"])),
            result=_loads(found["result"]),
            error=_loads(found["error"]),
            last_updated_at=found["last_updated_at"],
            next_check_at=found["next_check_at"],
        )

    def answers(self, task_id: str) -> dict[str, Answer]:
        rows = self._db.execute("SELECT key, response, answered_at FROM answers WHERE task_id = ?", (task_id,))
        return {row["key"]: Answer(json.loads(row["response"]), row["answered_at"]) for row in rows}

    def save_phase(self, task_id: str, phase: Phase, next_check_at: float | None) -> bool:
        """Record `phase` as the task's current one; False if the task had already ended (terminal is final)."""
        cursor = self._db.execute(
            f"UPDATE tasks SET status = ?, status_message = ?, input_keys = ?, result = ?, error = ?,"
            f" last_updated_at = ?, next_check_at = ? WHERE task_id = ? AND status NOT IN ({_TERMINAL_SQL})",
            (
                phase.status,
                phase.message,
                _dumps(list(phase.input_requests)),
                _dumps(phase.result),
                _dumps(phase.error),
                phase.since,
                None if phase.terminal else next_check_at,
                task_id,
            ),
        )
        return cursor.rowcount == 1

    def set_next_check(self, task_id: str, next_check_at: float | None) -> None:
        self._db.execute("UPDATE tasks SET next_check_at = ? WHERE task_id = ?", (next_check_at, task_id))

    def add_answers(
        self, task_id: str, responses: Mapping[str, Mapping[str, Any]], outstanding: set[str], at: float
    ) -> list[str]:
        """Store the responses whose keys are in `outstanding` and not answered yet; return the keys stored.

        Within one immediate transaction, and the (task_id, key) primary key makes a second answer to the
        same key a no-op, so of two concurrent deliveries exactly one wins.
        """
        stored: list[str] = []
        with self._transaction() as db:
            for key, response in responses.items():
                if key not in outstanding:
                    continue
                cursor = db.execute(
                    "INSERT OR IGNORE INTO answers (task_id, key, response, answered_at) VALUES (?,?,?,?)",
                    (task_id, key, _dumps(dict(response)), at),
                )
                if cursor.rowcount == 1:
                    stored.append(key)
        return stored

    def request_cancel(self, task_id: str, at: float) -> None:
        self._db.execute(
            f"UPDATE tasks SET cancel_requested_at = ?, next_check_at = ? WHERE task_id = ?"
            f" AND cancel_requested_at IS NULL AND status NOT IN ({_TERMINAL_SQL})",
            (at, at, task_id),
        )

    def due(self, now: float, limit: int = 500) -> list[str]:
        rows = self._db.execute(
            "SELECT task_id FROM tasks WHERE next_check_at IS NOT NULL AND next_check_at <= ?"
            " ORDER BY next_check_at LIMIT ?",
            (now, limit),
        )
        return [row["task_id"] for row in rows]

    def next_check_at(self) -> float | None:
        return self._db.execute("SELECT MIN(next_check_at) FROM tasks").fetchone()[0]

    def purge_expired(self, before: float) -> int:
        """Delete tasks whose TTL ran out before `before`."""
        cursor = self._db.execute(
            "DELETE FROM tasks WHERE ttl_ms IS NOT NULL AND created_at + ttl_ms / 1000.0 < ?", (before,)
        )
        return cursor.rowcount
