"""How a worker spends its shutdown timeout, so that it exits within it whatever its jobs and stdio processes do.

From SIGTERM (`stop`), one clock:

- every job runner (the default queue, the webhooks', each stdio server's own) is told at once; running jobs get
  `job_grace` to finish, then procrastinate cancels them (they are retried elsewhere);
- the tracker releases its leases, and the stdio processes are stopped the spec's way (stdin closed, a grace
  period, SIGTERM, SIGKILL: the SDK's sequence, about 4 s) in what is left;
- at `cut_at`, whatever has not ended is forced: every held stdio process group is killed (what waits on one then
  fails at once and winds down by itself), and a moment later the parts still running are cancelled;
- a `Watchdog` thread ends the process with exit code 70 should the event loop itself not get there (a part that
  swallows its cancellation, a thread that never returns): the orchestrator would kill it anyway, later.

Before, each stage had its own timeout one after the other (the default runner's 30 s, then the stdio queues'
30 s, then the processes'): a worker holding a process that did not exit took 55-80 s to stop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading

logger = logging.getLogger("taskhub.worker")

# Kept from the jobs' share for what comes after them: the tracker's release, the processes' stop (the SDK's
# sequence takes up to ~4 s for a process that ignores its closed stdin), the heartbeat's last word.
WIND_DOWN_RESERVE_SECONDS = 6.0
# Kept after the cut for what was killed or cancelled to end, and the process to exit.
CUT_RESERVE_SECONDS = 1.5
# Past the timeout, how long the watchdog waits before it ends the process itself.
WATCHDOG_GRACE_SECONDS = 2.0
WATCHDOG_EXIT_CODE = 70  # EX_SOFTWARE


def job_grace(shutdown_timeout: float) -> float:
    """How long running jobs may go on once the worker is told to stop."""
    return shutdown_timeout - min(WIND_DOWN_RESERVE_SECONDS, shutdown_timeout / 2)


def cut_at(shutdown_timeout: float) -> float:
    """Seconds after the stop when what has not ended is forced (then `cut_reserve` for it to end)."""
    return shutdown_timeout - cut_reserve(shutdown_timeout)


def cut_reserve(shutdown_timeout: float) -> float:
    return min(CUT_RESERVE_SECONDS, shutdown_timeout / 4)


class Watchdog:
    """`start()` once stopping: past the timeout and its grace, the process ends (os._exit), logged first."""

    def __init__(self, *, worker_id: str, shutdown_timeout: float) -> None:
        self.worker_id = worker_id
        self.shutdown_timeout = shutdown_timeout
        self._timer: threading.Timer | None = None

    def start(self) -> None:
        if self._timer is None:
            self._timer = threading.Timer(self.shutdown_timeout + WATCHDOG_GRACE_SECONDS, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def _expire(self) -> None:
        logger.critical(
            "worker %s: still running %g s after it was told to stop; exiting now (its leases expire, its jobs are"
            " retried elsewhere)",
            self.worker_id,
            self.shutdown_timeout + WATCHDOG_GRACE_SECONDS,
        )
        for handler in logging.getLogger().handlers + logger.handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        os._exit(WATCHDOG_EXIT_CODE)
