"""The MCP gateway: agents call the tools of taskhub's servers through taskhub (protocol 2026-07-28, the Tasks
extension on the server side). Every `tools/call` becomes a taskhub Task; `tasks/*` are answered from Postgres.

Why its protocol side is not the SDK's server (as the demo server's is), issue 30 item 6: the SDK's Streamable HTTP
app runs its session manager inside an ASGI lifespan, which daphne (the process that serves the pages, sockets and
this gateway from one port) does not implement; serving it would mean a second server process and port behind the
same tokens. What the SDK server would bring (sessions, its dispatcher) the stateless 2026-07-28 gateway does not
use: each POST is read by `protocol.py` into the SDK's own wire types (mcp_types), authorised by token, and answered
from Postgres, and `subscriptions/listen` waits on the committed-change hook that feeds the live pages (`waiting.py`).
Measured (bench/RESULTS.md, "Gateway: idle subscriptions/listen streams", 2026-12-04): 500 idle streams held 60 s
cost no transaction over the worker's own floor and 0.2 % of a core in daphne with no extra thread or connection,
a change reached a listening agent in 35 ms p50 (before: 60 streams took 38 % of a core, 61 threads, 59 more
connections and 309 ms). `tasks/get` through the gateway is a Postgres read per call: 148/s against the demo
server's in-memory 339/s (2026-12-01), the subject of issue 37.
"""
