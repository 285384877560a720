"""A webhook receiver on 127.0.0.1 for tests: answers from a script, checks each delivery's signature as a real
receiver would (taskhub.approvals.webhooks.verify_signature), and keeps what it received."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from taskhub.approvals.webhooks import verify_signature


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    signature_ok: bool | None  # None: no secret to check with
    path: str = ""  # with its query

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Answer:
    status: int = 200
    body: bytes = b"ok"
    delay: float = 0.0  # seconds before answering (a receiver that hangs)
    endless: bool = False  # streams the body without end (a receiver that answers a huge body)


@dataclass
class WebhookReceiver:
    """`answers` are used in turn; the last one repeats."""

    secret: str | None = None
    answers: list[Answer] = field(default_factory=lambda: [Answer()])
    received: list[Received] = field(default_factory=list)

    def start(self) -> WebhookReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {name.lower(): value for name, value in self.headers.items()}
                ok = None
                if receiver.secret is not None:
                    ok = verify_signature(
                        secret=receiver.secret,
                        timestamp=headers.get("x-taskhub-timestamp", ""),
                        body=body,
                        signature=headers.get("x-taskhub-signature", ""),
                    )
                index = len(receiver.received)
                receiver.received.append(Received(headers=headers, body=body, signature_ok=ok, path=self.path))
                answer = receiver.answers[min(index, len(receiver.answers) - 1)]
                time.sleep(answer.delay)
                try:
                    self.send_response(answer.status)
                    self.send_header("Content-Type", "text/plain")
                    if answer.endless:
                        self.end_headers()
                        chunk = b"x" * 65536
                        for _ in range(2000):  # 128 MB at most, unless the client hangs up first
                            self.wfile.write(chunk)
                        return
                    self.send_header("Content-Length", str(len(answer.body)))
                    self.end_headers()
                    self.wfile.write(answer.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
