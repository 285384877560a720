"""A 2025-11-25 MCP server over stdio, written by hand, whose tasks outlive the session (and the process) that made
them: the server side of the test that a task whose follower died is followed on by another worker.

Run as `python tests/durable_tasks_server.py STORE` (STORE: a JSON file, created if missing). It refuses
`server/discover` (-32601), answers `initialize` at 2025-11-25 declaring `tasks.requests.tools.call`, and lists one
tool, `brew` (`execution.taskSupport: "required"`, argument `seconds`). A task-augmented `tools/call` of `brew`
records the task in STORE (its id, when it is due) and answers with it at once. Every process reads STORE, so a
process started later (after the one that made the task was killed with its worker) knows the task: `tasks/get`
says `working` until it is due, then `completed`; `tasks/result` answers when it is due with the result
("brewed for N s"); `tasks/cancel` ends it cancelled. A task id STORE does not hold is -32602, as the reference
server answers. A call with a progress token gets `notifications/progress` with it while its task brews, after the
call answered, as the revision says the token stays the task's.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Started by path: the project directory on the path, so that `tests` is the package it is under pytest.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.stdio_peer import answer, refuse, send

VERSION = "2025-11-25"
POLL_INTERVAL_MS = 500
TOOL = {
    "name": "brew",
    "description": "Brews for a while, as a task.",
    "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]},
    "execution": {"taskSupport": "required"},
}

store = Path(sys.argv[1])
_storing = threading.Lock()


def tasks() -> dict[str, Any]:
    return json.loads(store.read_text()) if store.exists() else {}


def save(task_id: str, record: dict[str, Any]) -> None:
    with _storing:
        known = tasks()
        known[task_id] = record
        store.write_text(json.dumps(known))


def status_of(task_id: str, record: dict[str, Any]) -> dict[str, Any]:
    status = record.get("status") or ("completed" if time.time() >= record["due"] else "working")
    return {
        "taskId": task_id,
        "status": status,
        "statusMessage": f"brewing, {max(0, round(record['due'] - time.time()))} s to go"
        if status == "working"
        else "",
        "createdAt": record["created"],
        "lastUpdatedAt": datetime.now(UTC).isoformat(),
        "ttl": 600_000,
        "pollInterval": POLL_INTERVAL_MS,
    }


def result_when_due(request_id: Any, task_id: str) -> None:
    while True:
        record = tasks().get(task_id)
        if record is None or record.get("status") == "cancelled":
            refuse(request_id, -32603, "the task was cancelled")
            return
        if time.time() >= record["due"]:
            text = f"brewed for {record['seconds']:g} s"
            answer(request_id, {"content": [{"type": "text", "text": text}], "isError": False})
            return
        time.sleep(0.1)


def report_progress(token: Any, task_id: str) -> None:
    while (record := tasks().get(task_id)) is not None and not record.get("status") and time.time() < record["due"]:
        time.sleep(0.3)
        done = min(record["seconds"], round(record["seconds"] - (record["due"] - time.time()), 1))
        params = {"progressToken": token, "progress": done, "total": record["seconds"], "message": "brewing"}
        send({"jsonrpc": "2.0", "method": "notifications/progress", "params": params})


def main() -> None:
    for line in sys.stdin:
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        params = message.get("params") or {}
        if method == "initialize":
            capabilities = {"tools": {}, "tasks": {"requests": {"tools": {"call": {}}}, "cancel": {}}}
            info = {"name": "durable-tasks", "version": "1"}
            answer(request_id, {"protocolVersion": VERSION, "capabilities": capabilities, "serverInfo": info})
        elif method == "tools/list":
            answer(request_id, {"tools": [TOOL]})
        elif method == "ping":
            answer(request_id, {})
        elif method == "tools/call":
            if "task" not in params:
                refuse(request_id, -32601, "brew requires task augmentation")
                continue
            seconds = float((params.get("arguments") or {}).get("seconds", 1))
            task_id = f"brew-{uuid.uuid4().hex[:12]}"
            record = {"seconds": seconds, "due": time.time() + seconds, "created": datetime.now(UTC).isoformat()}
            save(task_id, record)
            answer(request_id, {"task": status_of(task_id, record)})
            if (token := (params.get("_meta") or {}).get("progressToken")) is not None:
                threading.Thread(target=report_progress, args=(token, task_id), daemon=True).start()
        elif method in ("tasks/get", "tasks/result", "tasks/cancel"):
            task_id = str(params.get("taskId"))
            record = tasks().get(task_id)
            if record is None:
                refuse(request_id, -32602, "Failed to retrieve task: Task not found")
            elif method == "tasks/get":
                answer(request_id, status_of(task_id, record))
            elif method == "tasks/result":
                threading.Thread(target=result_when_due, args=(request_id, task_id), daemon=True).start()
            else:
                save(task_id, {**record, "status": "cancelled"})
                answer(request_id, status_of(task_id, {**record, "status": "cancelled"}))
        elif method is not None and request_id is not None:
            refuse(request_id, -32601, f"Method not found: {method}")


if __name__ == "__main__":
    main()
