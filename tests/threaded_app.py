"""Serve an ASGI app with uvicorn on a free loopback port, in a thread of the test process."""

from __future__ import annotations

import threading

import uvicorn

from taskhub.demo.server import tcp_socket


class ThreadedApp:
    def __init__(self, app) -> None:
        self.app = app
        self.port: int | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        sock = tcp_socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        while not self._server.started:
            threading.Event().wait(0.01)
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)
