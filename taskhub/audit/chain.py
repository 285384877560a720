"""The audit trail's hash chains (one per month, migrations 0009 and 0011): sealing committed rows into them, whether
each is whole, and where it first breaks.

A row is written unsealed and sealed after its commit (0011's audit_seal: the worker every minute, and everything
here before it reads). The database recomputes every row's hash with the same function the sealer used
(audit_row_hash), so what is checked is exactly what was written; scripts/verify_audit_export.py does the same
offline, from an export or an archive.
"""

import datetime
from dataclasses import dataclass

from django.db import connection
from django.db.models import F

GENESIS = bytes(32)  # the previous hash of a month's first row

SEAL_BATCH = 10_000
# The chain's order: seq (a row with a hash but no seq was tampered with: it is walked last, and breaks there).
CHAIN_ORDER = "seq NULLS LAST, id"
LAST_FIRST = "seq DESC NULLS FIRST, id DESC"
CHAIN_ORDER_FIELDS = (F("seq").asc(nulls_last=True), "id")  # the same, for the ORM
SEALED_IN_MONTH = "time >= %(start)s AND time < %(end)s AND hash IS NOT NULL"
MONTH_WALK = f"""
SELECT id, seq, (audit_row_hash(prev_hash, id, time, actor_id, actor_label, action, task_id, server_id, data)
            IS NOT DISTINCT FROM hash) AS content_ok,
       prev_hash IS NOT DISTINCT FROM coalesce(lag(hash) OVER (ORDER BY {CHAIN_ORDER}), %(genesis)s) AS linked,
       prev_hash, hash
FROM audit_auditevent WHERE {SEALED_IN_MONTH}
"""
FIRST_BREAK = f"SELECT id, content_ok, linked, prev_hash FROM ({MONTH_WALK}) walk WHERE NOT (content_ok AND linked)"
FIRST_BREAK += f" ORDER BY {CHAIN_ORDER} LIMIT 1"


def seal_committed() -> int:
    """Seal every committed row not sealed yet into its month's chain; how many. Run it outside other work's
    transaction: the sealers' lock is held until the transaction that took it ends."""
    sealed = 0
    with connection.cursor() as cursor:
        while True:
            cursor.execute("SELECT audit_seal(%s)", [SEAL_BATCH])
            (count,) = cursor.fetchone()
            sealed += count
            if count < SEAL_BATCH:
                return sealed


@dataclass(frozen=True)
class MonthChain:
    month: str  # "2026-11"
    rows: int  # sealed
    head: str  # the hash of its last row, hex ("" for none)
    broken_at: int | None = None
    problem: str = ""
    unsealed: int = 0  # rows not in the chain yet (written by a transaction that committed after the last seal)

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
    """The month's sealed rows walked in chain order (seal_committed first, to cover every committed row)."""
    start, end = month_bounds(month)
    params = {"start": start, "end": end, "genesis": GENESIS}
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FILTER (WHERE hash IS NOT NULL), count(*) FILTER (WHERE hash IS NULL),"
            f" (SELECT hash FROM audit_auditevent WHERE {SEALED_IN_MONTH} ORDER BY {LAST_FIRST} LIMIT 1)"
            " FROM audit_auditevent WHERE time >= %(start)s AND time < %(end)s",
            params,
        )
        rows, unsealed, head = cursor.fetchone()
        head = bytes(head).hex() if head is not None else ""
        cursor.execute(FIRST_BREAK, params)
        broken = cursor.fetchone()
        if broken is None:
            return MonthChain(month=month, rows=rows, head=head, unsealed=unsealed)
        row_id, content_ok, _, prev_hash = broken
        if not content_ok:
            problem = f"row {row_id} does not match its hash: it was changed (or given another row's id or time)"
        else:
            cursor.execute(
                f"SELECT id FROM audit_auditevent WHERE {SEALED_IN_MONTH} AND hash = %(prev)s",
                {**params, "prev": prev_hash},
            )
            follows = cursor.fetchone()
            if follows is not None:
                problem = f"row {row_id} follows row {follows[0]} in the chain but not in order: rows were reordered"
            else:
                problem = f"a row is missing before row {row_id} (deleted): its previous hash is no row's"
    return MonthChain(month=month, rows=rows, head=head, broken_at=row_id, problem=problem, unsealed=unsealed)


def verify_all() -> list[MonthChain]:
    """Every month's chain, after sealing what is committed."""
    seal_committed()
    return [chain for chain in map(verify_month, months_present()) if chain.rows]
