"""Worker heartbeats: which lease owners are alive.

procrastinate keeps a heartbeat of its own per job runner (`procrastinate_workers`), but by a number that changes
whenever the runner restarts and with no name, so it cannot say whose leases (`tasks_taskpoll.lease_owner`, a
worker's `--name`) are orphaned. This row, keyed by that name, can: `taskhub.worker.heartbeats` beats it, and
the other workers take over the leases of an owner whose beat is older than TASKHUB_STALLED_WORKER_SECONDS.
"""

from __future__ import annotations

from django.db import models


class WorkerHeartbeat(models.Model):
    """One worker process, by its lease-owner name; beat from the database's clock (`now()`), never the worker's."""

    owner = models.CharField(max_length=200, primary_key=True)
    started_at = models.DateTimeField()
    beat_at = models.DateTimeField(db_index=True)
    # Set by the worker that took this owner's leases over; cleared when the owner beats again.
    taken_over_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "worker_heartbeat"

    def __str__(self) -> str:
        return f"{self.owner} beat at {self.beat_at}"
