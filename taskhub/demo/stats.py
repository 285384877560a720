"""Request counters served at GET /demo/stats, counted where the requests are handled.

Only tasks that exist are counted, so a client sending made-up ids cannot grow these maps.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class DemoStats:
    def __init__(self) -> None:
        self.polls: Counter[str] = Counter()
        self.max_concurrent_polls: Counter[str] = Counter()
        self.deliveries: Counter[str] = Counter()
        self.updates_received: Counter[str] = Counter()  # tasks/update requests per task, counted on arrival
        self.cancels: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()  # tools/call per tool (of the demo's own tools only)
        self._polls_in_flight: Counter[str] = Counter()

    @contextmanager
    def polling(self, task_id: str) -> Iterator[None]:
        """Count one tasks/get for `task_id` and how many of them overlap while it runs."""
        self.polls[task_id] += 1
        self._polls_in_flight[task_id] += 1
        self.max_concurrent_polls[task_id] = max(self.max_concurrent_polls[task_id], self._polls_in_flight[task_id])
        try:
            yield
        finally:
            self._polls_in_flight[task_id] -= 1
            if not self._polls_in_flight[task_id]:
                del self._polls_in_flight[task_id]

    def update_received(self, task_id: str) -> None:
        self.updates_received[task_id] += 1

    def delivered(self, task_id: str, key: str) -> None:
        self.deliveries[f"{task_id}/{key}"] += 1

    def called(self, tool: str) -> None:
        self.calls[tool] += 1

    def cancel_requested(self, task_id: str) -> None:
        self.cancels[task_id] += 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "polls": dict(self.polls),
            "max_concurrent_polls": dict(self.max_concurrent_polls),
            "deliveries": dict(self.deliveries),
            "updates_received": dict(self.updates_received),
            "cancels": dict(self.cancels),
            "calls": dict(self.calls),
        }
