from django.db import models


class TaskStatusDelta(models.Model):
    """Changes to the number of tasks per (server, status), kept by triggers on tasks_task (migration 0001), so
    that `/metrics` reads the tasks by status and server from a few rows instead of counting every task.

    INSERT and DELETE statements on tasks_task add one row per (server, status) they touch; an UPDATE that changes
    a task's status adds -1 and +1. The sum per (server, status) is the number of tasks; `counts.py` folds the
    rows into one per (server, status) (a scrape once there are more than a few hundred, a periodic job every five
    minutes). Inserting rows never waits on a lock, so the counting costs the task writes no contention. No
    foreign key: a row is only arithmetic.
    """

    server_id = models.BigIntegerField()
    status = models.CharField(max_length=16)
    delta = models.BigIntegerField()

    class Meta:
        verbose_name = "task status delta"

    def __str__(self) -> str:
        return f"{self.status} on {self.server_id}: {self.delta:+d}"


class InputRequestStateDelta(models.Model):
    """Changes to the number of input requests open and answered (stored, not yet delivered) per server, kept by
    triggers on tasks_inputrequest (migration 0002) as TaskStatusDelta is for tasks: `/metrics` reads them exactly
    from a few rows instead of counting the requests. Other states are not counted (nothing reads them)."""

    server_id = models.BigIntegerField()
    state = models.CharField(max_length=12)
    delta = models.BigIntegerField()

    class Meta:
        verbose_name = "input request state delta"

    def __str__(self) -> str:
        return f"{self.state} on {self.server_id}: {self.delta:+d}"


class LeaseOwnerDelta(models.Model):
    """Changes to the number of poll rows (tasks_taskpoll) naming each worker as their lease owner, kept by triggers
    (migration 0002): a claim that changes the owner, a release, a take-over, a row inserted or deleted with an
    owner. The tracker's claims that keep the owner, its reschedules and renewals write nothing here."""

    owner = models.CharField(max_length=200)
    delta = models.BigIntegerField()

    class Meta:
        verbose_name = "lease owner delta"

    def __str__(self) -> str:
        return f"{self.owner}: {self.delta:+d}"


class PollFailureDelta(models.Model):
    """Changes to the number of poll rows per (server, consecutive failures), for the rows failing now (failures
    above 0), kept by triggers on tasks_taskpoll (migration 0002): a server's most failures in a row is the highest
    `failures` whose rows sum above 0, read without looking at a task."""

    server_id = models.BigIntegerField()
    failures = models.PositiveIntegerField()
    delta = models.BigIntegerField()

    class Meta:
        verbose_name = "poll failure delta"

    def __str__(self) -> str:
        return f"{self.failures} failures on {self.server_id}: {self.delta:+d}"
