"""The leases on stdio servers' processes (`servers_serverprocess`): which worker runs each enabled stdio server.

One statement claims and renews at once: every enabled stdio server gets a row; a worker takes the rows nobody
holds, whose lease expired, or that it holds already, and sets their expiry one lease ahead. It returns the
servers the worker holds now. The owner is the worker id, as in the tracker's task leases (tracker/leases.py),
whose claim takes a stdio server's tasks only in the worker holding that server's lease here.

A worker that dies stops renewing; once its leases expire another worker's next claim takes its servers over
(and starts their processes). A worker that stops releases its leases, so another takes over at once.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import connection

from taskhub import procrastinate_sql

CLAIM_SQL = """
INSERT INTO servers_serverprocess
    (server_id, lease_owner, lease_expires_at, state, restarts, last_exit, stderr_tail, updated_at)
SELECT server.id, %(owner)s, now() + %(lease)s, 'stopped', 0, '', '[]'::jsonb, now()
FROM servers_server AS server
WHERE server.transport = 'stdio' AND server.enabled
ON CONFLICT (server_id) DO UPDATE
SET lease_owner = EXCLUDED.lease_owner, lease_expires_at = EXCLUDED.lease_expires_at,
    -- taken over: what the page said of the previous owner's process is no longer true
    state = CASE WHEN servers_serverprocess.lease_owner = EXCLUDED.lease_owner
                 THEN servers_serverprocess.state ELSE 'stopped' END,
    pid = CASE WHEN servers_serverprocess.lease_owner = EXCLUDED.lease_owner THEN servers_serverprocess.pid END
WHERE servers_serverprocess.lease_owner = '' OR servers_serverprocess.lease_owner = EXCLUDED.lease_owner
   OR servers_serverprocess.lease_expires_at IS NULL OR servers_serverprocess.lease_expires_at < now()
RETURNING server_id
"""

# Only rows this worker still holds: a lease it lost meanwhile is somebody else's now.
RELEASE_SQL = """
UPDATE servers_serverprocess
SET lease_owner = '', lease_expires_at = NULL, state = 'stopped', pid = NULL, next_start_at = NULL, updated_at = now()
WHERE lease_owner = %(owner)s AND (%(all)s OR server_id = ANY(%(ids)s))
"""


def claim(*, owner: str, lease: timedelta) -> set[int]:
    """Claim or renew; the ids of the stdio servers this worker holds now."""
    with connection.cursor() as cursor:
        cursor.execute(CLAIM_SQL, {"owner": owner, "lease": lease})
        return {row[0] for row in cursor.fetchall()}


def release(*, owner: str, server_ids: list[int] | None = None) -> None:
    """Give up the leases on these servers (None: all of them)."""
    with connection.cursor() as cursor:
        cursor.execute(RELEASE_SQL, {"owner": owner, "all": server_ids is None, "ids": list(server_ids or [])})


def requeue_if_no_longer_stdio(*, server_id: int, queue: str, to: str) -> int:
    """Jobs left in a stdio server's queue once it is no stdio server any more go to `to` (procrastinate_sql)."""
    with connection.cursor() as cursor:
        return procrastinate_sql.requeue_if_no_longer_stdio(cursor, server_id=server_id, queue=queue, to=to)
