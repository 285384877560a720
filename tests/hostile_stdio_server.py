"""A hostile MCP server over stdio for tests: newline-delimited JSON-RPC on stdin/stdout, written by hand.

Run as `python tests/hostile_stdio_server.py`. It answers `server/discover` and `tools/list` properly,
refuses `subscriptions/listen` (-32601, so the tracker polls), answers `tools/call` with a task handle for
the task id in its `taskId` argument, acknowledges `tasks/cancel`, and answers `tasks/get` according to the
task id's prefix:

- `control-…`: a working task whose status message says how often it was asked ("step n");
- `garbage-…`: a line that is not JSON instead of the answer;
- `notrpc-…`: a JSON line that is not a JSON-RPC message instead of the answer;
- `long-…`: a valid answer whose status message makes the line `HOSTILE_LONG_MB` (30) MB long;
- `stderr-…`: `HOSTILE_STDERR_MB` (20) MB on stderr, then a valid working answer;
- `cut-…`: half an answer, then stdout closed (the process lives on);
- `exit-…`: half an answer, then the process exits;
- `othertask-…`: a valid answer about another task;
- `wrongid-…`: a valid answer under another JSON-RPC id;
- `noresult-…`: a completed task without its result;
- `badutf8-…`: an answer holding bytes that are not UTF-8;
- `deep-…`: an answer nested 100 000 levels deep;
- `array-…`: a JSON array instead of the answer;
- `badschema-…`: an input request whose requestedSchema is not an object schema;
- `endless-…`: a working task that never ends, even when cancelled;
- anything else: -32602 (unknown task).

`tools/call` with a `taskId` of `hang-…` is never answered (it says on stderr that it got it).
With HOSTILE_STUBBORN set it ignores SIGTERM and stays after its stdin closes: only SIGKILL ends it.
With HOSTILE_PRINT_NUL set it writes a NUL byte on stderr at start.
With HOSTILE_PRINT_ENV set it first writes its whole environment to stderr, as a careless server's debug
output would.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections import Counter
from typing import Any

# Started by path: the project directory on the path, so that `tests` is the package it is under pytest.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.scripted_server import DISCOVER_RESULT, TOOLS_RESULT

out = sys.stdout.buffer
polls: Counter[str] = Counter()


def send(message: Any) -> None:
    out.write(json.dumps(message).encode() + b"\n")
    out.flush()


def working(task_id: str, **fields: Any) -> dict[str, Any]:
    return {"resultType": "complete", "taskId": task_id, "status": "working", "pollIntervalMs": 250, **fields}


def answer_task(request_id: Any, task_id: str) -> None:
    polls[task_id] += 1
    kind = task_id.split("-", 1)[0]
    if kind == "control":
        send({"jsonrpc": "2.0", "id": request_id, "result": working(task_id, statusMessage=f"step {polls[task_id]}")})
    elif kind == "garbage":
        out.write(b"Traceback (most recent call last): this is not JSON\n")
        out.flush()
    elif kind == "notrpc":
        send({"hello": "world", "id": request_id})
    elif kind == "long":
        size = int(float(os.environ.get("HOSTILE_LONG_MB", "30")) * 1024 * 1024)
        send({"jsonrpc": "2.0", "id": request_id, "result": working(task_id, statusMessage="x" * size)})
    elif kind == "stderr":
        chunk = b"e" * 1023 + b"\n"
        for _ in range(int(float(os.environ.get("HOSTILE_STDERR_MB", "20")) * 1024)):
            sys.stderr.buffer.write(chunk)
        sys.stderr.buffer.flush()
        send({"jsonrpc": "2.0", "id": request_id, "result": working(task_id, statusMessage="loud")})
    elif kind in ("cut", "exit"):
        line = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": working(task_id)}).encode()
        out.write(line[: len(line) // 2])
        out.flush()
        if kind == "exit":
            os._exit(3)
        os.close(sys.stdout.fileno())
        threading.Event().wait()  # never set: hangs for good
    elif kind == "othertask":
        send({"jsonrpc": "2.0", "id": request_id, "result": working("somebody-else")})
    elif kind == "wrongid":
        send({"jsonrpc": "2.0", "id": f"not-{request_id}", "result": working(task_id)})
    elif kind == "noresult":
        send({"jsonrpc": "2.0", "id": request_id, "result": working(task_id, status="completed")})
    elif kind == "badutf8":
        line = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": working(task_id, statusMessage="@@")})
        out.write(line.encode().replace(b"@@", b"\xff\xfe") + b"\n")
        out.flush()
    elif kind == "deep":
        head = json.dumps({"jsonrpc": "2.0", "id": request_id}).encode()[:-1]
        out.write(head + b', "result": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n")
        out.flush()
    elif kind == "array":
        send([1, 2, 3])
    elif kind == "badschema":
        schema_request = {"method": "elicitation/create", "params": {"message": "Go?", "requestedSchema": "yes"}}
        result = working(task_id, status="input_required", inputRequests={"k": schema_request})
        send({"jsonrpc": "2.0", "id": request_id, "result": result})
    elif kind == "endless":
        send({"jsonrpc": "2.0", "id": request_id, "result": working(task_id, pollIntervalMs=100)})
    else:
        send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32602, "message": "Task not found"}})


def main() -> None:
    if os.environ.get("HOSTILE_PRINT_ENV"):
        sys.stderr.write(f"debug: starting with {dict(os.environ)!r}\n")
        sys.stderr.flush()
    stubborn = bool(os.environ.get("HOSTILE_STUBBORN"))
    if stubborn:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.environ.get("HOSTILE_PRINT_NUL"):
        sys.stderr.buffer.write(b"a nul\x00on stderr\n")
        sys.stderr.flush()
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            continue
        request_id, method = message["id"], message.get("method")
        params = message.get("params") or {}
        if method == "server/discover":
            send({"jsonrpc": "2.0", "id": request_id, "result": DISCOVER_RESULT})
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": request_id, "result": TOOLS_RESULT})
        elif method == "tasks/get":
            answer_task(request_id, str(params.get("taskId")))
        elif method == "tools/call":
            task_id = str((params.get("arguments") or {}).get("taskId"))
            if task_id.startswith("hang-"):
                sys.stderr.write(f"holding tools/call {task_id}\n")
                sys.stderr.flush()
                continue
            handle = {"resultType": "task", "taskId": task_id, "status": "working", "pollIntervalMs": 100}
            send({"jsonrpc": "2.0", "id": request_id, "result": handle})
        elif method == "tasks/cancel":
            send({"jsonrpc": "2.0", "id": request_id, "result": {"resultType": "complete"}})
        else:
            send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": "Method not found"}})
    if stubborn:
        threading.Event().wait()  # stdin closed: stays all the same


if __name__ == "__main__":
    main()
