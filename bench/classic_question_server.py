"""A server of the 2025-06-18 revision whose one tool asks a question in the middle of its call, and stamps when the
answer arrives: the server side of bench/classic_answer.py.

    python bench/classic_question_server.py --port 8792

Streamable HTTP with sessions, as the reference servers of that revision serve it (Starlette and uvicorn, which the
`mcp` SDK installs): `initialize` (and `server/discover` refused with -32601, so a client of the newer revision
falls back to it), `tools/list` with the tool `ask`, and `tools/call` of `ask`, answered as an event stream: first
an `elicitation/create` (a form with one boolean, "Approve?"), then, once the client POSTs its response, the tool's
result. `GET /bench/answers`: `{"<tag>": <time.time()>}`, when the HTTP request carrying the response to the question
of the call whose `tag` argument that was reached the application (before its body is parsed). A GET of the MCP
endpoint (the standalone stream) is refused with 405.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import socket
import time
import uuid

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

PROTOCOL_VERSION = "2025-06-18"
TOOL = {
    "name": "ask",
    "description": "Asks 'Approve?' in the middle of the call; answers with what it got.",
    "inputSchema": {"type": "object", "properties": {"tag": {"type": "string"}}},
}
QUESTION = {
    "message": "Release?",
    "requestedSchema": {
        "type": "object",
        "properties": {"approve": {"type": "boolean", "title": "Approve?"}},
        "required": ["approve"],
    },
}

answers: dict[str, float] = {}
waiting: dict[str, tuple[str, asyncio.Future]] = {}  # question id -> (tag, the response's future)
question_ids = itertools.count(1)


def result(request_id, value) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "result": value}


def event(message: dict) -> bytes:
    return f"event: message\ndata: {json.dumps(message)}\n\n".encode()


async def mcp(request: Request) -> Response:
    if request.method == "GET":
        return Response(status_code=405)
    if request.method == "DELETE":
        return Response(status_code=200)
    arrived = time.time()
    message = json.loads(await request.body())
    if "method" not in message:  # a response: the answer to a question
        pending = waiting.pop(str(message.get("id")), None)
        if pending is not None:
            tag, future = pending
            answers[tag] = arrived
            future.set_result(message.get("result"))
        return Response(status_code=202)
    method, request_id = message["method"], message.get("id")
    if request_id is None:  # a notification
        return Response(status_code=202)
    if method == "initialize":
        initialized = {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "classic-question-server", "version": "1"},
        }
        return JSONResponse(result(request_id, initialized), headers={"Mcp-Session-Id": uuid.uuid4().hex})
    if method == "tools/list":
        return JSONResponse(result(request_id, {"tools": [TOOL]}))
    if method == "tools/call":
        return StreamingResponse(call(request_id, message.get("params") or {}), media_type="text/event-stream")
    return JSONResponse({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": "Method not found"}})


async def call(request_id, params: dict):
    tag = str((params.get("arguments") or {}).get("tag", ""))
    question_id = f"q-{next(question_ids)}"
    future = asyncio.get_running_loop().create_future()
    waiting[question_id] = (tag, future)
    yield event({"jsonrpc": "2.0", "id": question_id, "method": "elicitation/create", "params": QUESTION})
    answer = await future
    text = f"answered: {json.dumps(answer)}"
    yield event(result(request_id, {"content": [{"type": "text", "text": text}], "isError": False}))


async def bench_answers(request: Request) -> Response:
    return JSONResponse(answers)


app = Starlette(routes=[Route("/mcp", mcp, methods=["GET", "POST", "DELETE"]), Route("/bench/answers", bench_answers)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8792)
    args = parser.parse_args()
    listener = socket.create_server(("127.0.0.1", args.port))
    print(f"classic question server listening on http://127.0.0.1:{args.port}/mcp", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    asyncio.run(server.serve(sockets=[listener]))


if __name__ == "__main__":
    main()
