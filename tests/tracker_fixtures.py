"""A Tracker (`taskhub.worker.tracker`) run in the test process, as a worker process runs it: on an event
loop of its own in a thread, while the test thread reads the database through the ORM."""

from __future__ import annotations

import asyncio
import threading

from taskhub.worker.tracker import Tracker


class RunningTracker:
    """A Tracker on its own event loop in a thread; `stop()` asks it to stop and waits until `run` returns."""

    def __init__(self, **options) -> None:
        self.tracker = Tracker(**options)
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.stop_event = asyncio.Event()
        self._ready.set()
        try:
            self.loop.run_until_complete(self.tracker.run(self.stop_event))
        except BaseException as error:
            self.error = error
        finally:
            self.loop.close()

    def start(self) -> RunningTracker:
        self._thread.start()
        self._ready.wait(5)
        return self

    def stop(self, timeout: float = 30) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.stop_event.set)
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the tracker did not stop"
        if self.error is not None:
            raise self.error

    def __enter__(self) -> RunningTracker:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
