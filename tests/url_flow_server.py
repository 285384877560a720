"""A 2025-11-25 MCP server over stdio, written by hand, whose one tool sends a person to a link and later says the
interaction there completed: the server side of the test that `notifications/elicitation/complete` closes the card.

Run as `python tests/url_flow_server.py`. It refuses `server/discover` (-32601, so a client of the newer revision
falls back to `initialize`), answers `initialize` at 2025-11-25 and `tools/list` with `sign_in`. A `tools/call` of
`sign_in` (arguments `url`, `done_file`) sends an `elicitation/create` in URL mode (its `elicitationId` is
`flow-<the call's id>`); once the file `done_file` exists it sends `notifications/elicitation/complete` for it; once
the client answered the question, the call's result says which action it answered with ("action: accept").
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

# Started by path: the project directory on the path, so that `tests` is the package it is under pytest.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.stdio_peer import answer, send

VERSION = "2025-11-25"
TOOL = {
    "name": "sign_in",
    "description": "Sends the person to a link to sign in.",
    "inputSchema": {
        "type": "object",
        "properties": {"url": {"type": "string"}, "done_file": {"type": "string"}},
        "required": ["url", "done_file"],
    },
}

_asked: dict[str, Any] = {}  # the id of our elicitation/create -> the id of the tools/call it belongs to


def complete_once_done(done_file: str, elicitation_id: str) -> None:
    while not os.path.exists(done_file):  # the test creates the file once the card is open
        time.sleep(0.05)
    params = {"elicitationId": elicitation_id}
    send({"jsonrpc": "2.0", "method": "notifications/elicitation/complete", "params": params})


def main() -> None:
    for line in sys.stdin:
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if method == "initialize":
            answer(
                request_id,
                {
                    "protocolVersion": VERSION,
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "url-flow", "version": "1"},
                },
            )
        elif method == "tools/list":
            answer(request_id, {"tools": [TOOL]})
        elif method == "ping":
            answer(request_id, {})
        elif method == "tools/call":
            arguments = message["params"].get("arguments") or {}
            elicitation_id, ask_id = f"flow-{request_id}", f"ask-{request_id}"
            _asked[ask_id] = request_id
            params = {
                "mode": "url",
                "url": arguments["url"],
                "message": "Sign in at the link to continue.",
                "elicitationId": elicitation_id,
            }
            send({"jsonrpc": "2.0", "id": ask_id, "method": "elicitation/create", "params": params})
            threading.Thread(
                target=complete_once_done, args=(arguments["done_file"], elicitation_id), daemon=True
            ).start()
        elif method is None and request_id in _asked:
            action = (message.get("result") or {}).get("action", "an error")
            text = {"type": "text", "text": f"action: {action}"}
            answer(_asked.pop(request_id), {"content": [text], "isError": False})
        elif method is not None and request_id is not None:
            error = {"code": -32601, "message": f"Method not found: {method}"}
            send({"jsonrpc": "2.0", "id": request_id, "error": error})


if __name__ == "__main__":
    main()
