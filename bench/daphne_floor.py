"""The floor of one daphne for bench/gateway.py (issue 37 item 1): a bare ASGI application that reads a request's
body and answers every request with the same JSON-RPC result, of the size and shape of the gateway's `tasks/get`
answer. No Django, no database: what daphne itself spends per request, which the gateway's throughput on one daphne
cannot beat whatever taskhub's own code does.

    daphne -b 127.0.0.1 -p 8123 daphne_floor:application     # from bench/ (bench/gateway.py starts it)
"""

import json

ANSWER = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {
            "resultType": "complete",
            "taskId": "00000000-0000-4000-8000-000000000000",
            "status": "working",
            "statusMessage": "step 1 of 1",
            "createdAt": "2026-12-05T09:00:00.000000Z",
            "lastUpdatedAt": "2026-12-05T09:00:00.000000Z",
            "ttlMs": 3600000,
            "pollIntervalMs": 10000,
            "_meta": {"io.modelcontextprotocol/related-task": {"taskId": "00000000-0000-4000-8000-000000000000"}},
        },
    }
).encode()
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]


async def application(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})
