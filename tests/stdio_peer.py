"""What the hand-written stdio MCP servers of the tests share: one JSON-RPC message per line on stdout, written whole
even when threads answer (a request answered later, a notification sent on its own)."""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

_writing = threading.Lock()


def send(message: dict[str, Any]) -> None:
    with _writing:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def answer(request_id: Any, result: dict[str, Any]) -> None:
    send({"jsonrpc": "2.0", "id": request_id, "result": result})


def refuse(request_id: Any, code: int, message: str) -> None:
    send({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})
