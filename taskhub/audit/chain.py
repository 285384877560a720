"""The audit trail's hash chains (one per month, migration 0009): whether each is whole, and where it first breaks.

The database recomputes every row's hash with the same function its trigger used (audit_row_hash), so what is checked
is exactly what was written; scripts/verify_audit_export.py does the same offline, from an export or an archive.
"""

import datetime
from dataclasses import dataclass

from django.db import connection

GENESIS = bytes(32)  # the previous hash of a month's first row

MONTH_WALK = """
SELECT id, (audit_row_hash(prev_hash, id, time, actor_id, actor_label, action, task_id, server_id, data)
            IS NOT DISTINCT FROM hash) AS content_ok,
       prev_hash IS NOT DISTINCT FROM coalesce(lag(hash) OVER (ORDER BY id), %(genesis)s) AS linked,
       prev_hash, hash
FROM audit_auditevent WHERE time >= %(start)s AND time < %(end)s
"""
FIRST_BREAK = f"SELECT id, content_ok, linked, prev_hash FROM ({MONTH_WALK}) walk WHERE NOT (content_ok AND linked)"
FIRST_BREAK += " ORDER BY id LIMIT 1"


@dataclass(frozen=True)
class MonthChain:
    month: str  # "2026-11"
    rows: int
    head: str  # the hash of its last row, hex ("" for none)
    broken_at: int | None = None
    problem: str = ""

    @property
    def whole(self) -> bool:
        return self.broken_at is None


def month_bounds(month: str) -> tuple[datetime.datetime, datetime.datetime]:
    start = datetime.datetime.strptime(month, "%Y-%m").replace(tzinfo=datetime.UTC)
    end = (start + datetime.timedelta(days=32)).replace(day=1)
    return start, end


def months_present() -> list[str]:
    """The months from the oldest row's to the newest's (UTC), by the time index; empty ones are skipped later."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT min(time), max(time) FROM audit_auditevent")
        oldest, newest = cursor.fetchone()
    if oldest is None:
        return []
    months, month = [], oldest.astimezone(datetime.UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    while month <= newest:
        months.append(f"{month:%Y-%m}")
        month = (month + datetime.timedelta(days=32)).replace(day=1)
    return months


def verify_month(month: str) -> MonthChain:
    start, end = month_bounds(month)
    params = {"start": start, "end": end, "genesis": GENESIS}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), (SELECT hash FROM audit_auditevent WHERE time >= %(start)s AND time < %(end)s"
            " ORDER BY id DESC LIMIT 1) FROM audit_auditevent WHERE time >= %(start)s AND time < %(end)s",
            params,
        )
        rows, head = cursor.fetchone()
        head = bytes(head).hex() if head is not None else ""
        cursor.execute(FIRST_BREAK, params)
        broken = cursor.fetchone()
        if broken is None:
            return MonthChain(month=month, rows=rows, head=head)
        row_id, content_ok, _, prev_hash = broken
        if not content_ok:
            problem = f"row {row_id} does not match its hash: it was changed (or given another row's id or time)"
        else:
            cursor.execute(
                "SELECT id FROM audit_auditevent WHERE time >= %(start)s AND time < %(end)s AND hash = %(prev)s",
                {**params, "prev": prev_hash},
            )
            follows = cursor.fetchone()
            if follows is not None:
                problem = f"row {row_id} follows row {follows[0]} in the chain but not in order: rows were reordered"
            else:
                problem = f"a row is missing before row {row_id} (deleted): its previous hash is no row's"
    return MonthChain(month=month, rows=rows, head=head, broken_at=row_id, problem=problem)


def verify_all() -> list[MonthChain]:
    return [chain for chain in map(verify_month, months_present()) if chain.rows]
