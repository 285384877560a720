"""A proxy that holds tasks/update requests, for tests of deliveries cut off mid-send.

A WireRecorder (it forwards everything else unchanged) that, while `holding` is set, keeps each tasks/update it
receives from reaching the server: the request waits in the proxy until the test releases it (`release_all`, then
it goes on), or its client disconnects (a killed worker's connection closes): then it is dropped, as a request cut
off on its way is, and the server never sees it. A held request that neither happens to within `max_hold_seconds`
goes on (so a proxy that failed to notice a disconnect shows up as a duplicate delivery, not as a silent pass).
"""

from __future__ import annotations

import asyncio
import threading
import time

from starlette.requests import Request
from starlette.responses import Response

from tests.wire_recorder import WireRecorder


class UpdateHoldingProxy(WireRecorder):
    def __init__(self, upstream: str, *, max_hold_seconds: float = 60.0) -> None:
        super().__init__(upstream)
        self.holding = True
        self.max_hold_seconds = max_hold_seconds
        self.held = 0  # tasks/update requests being held now
        self.dropped = 0  # held ones whose client went away: never forwarded
        self._released = threading.Event()
        self._count_lock = threading.Lock()

    def release_all(self) -> None:
        """Stop holding: the held requests go on, and the next ones are not held."""
        self.holding = False
        self._released.set()

    async def _forward(self, request: Request) -> Response:
        raw = await request.body()
        if self.holding and b'"tasks/update"' in raw and not await self._hold(request):
            return Response(status_code=499)
        return await super()._forward(request)  # its body is read already: starlette keeps it for the proxy

    async def _hold(self, request: Request) -> bool:
        """Wait while held; False: the client disconnected meanwhile (the request is dropped)."""
        with self._count_lock:
            self.held += 1
        try:
            deadline = time.monotonic() + self.max_hold_seconds
            while not self._released.is_set() and time.monotonic() < deadline:
                if await request.is_disconnected():
                    with self._count_lock:
                        self.dropped += 1
                    return False
                await asyncio.sleep(0.05)
            return True
        finally:
            with self._count_lock:
                self.held -= 1
