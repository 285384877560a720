"""Retention of the audit trail: a month is archived to a JSONL file (its rows in chain order and its chain head), then
its partition dropped, by the database owner only; both are audited.

The application's role owns no table: DROP TABLE is refused it by Postgres, and these functions refuse it first, with a
message that says which role may. A month is dropped only when it is older than TASKHUB_AUDIT_RETENTION_MONTHS, has a
partition of its own, and its rows and head are still what its archive (the newest audit.archived of that month)
recorded: a row written after the archive would otherwise go unarchived.
"""

import datetime
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from taskhub.audit import chain
from taskhub.audit.exporting import export_line, export_row, with_data_text
from taskhub.audit.models import AuditEvent
from taskhub.audit.services import SYSTEM, record_event

MONTHS_AHEAD = 2
MONTH = re.compile(r"\d{4}-(0[1-9]|1[0-2])")


class RetentionRefused(Exception):
    pass


@dataclass(frozen=True)
class Archive:
    month: str
    path: Path
    rows: int
    head: str
    sha256: str


def ensure_months_ahead(*, now: datetime.datetime | None = None) -> None:
    """This month's partition and the next MONTHS_AHEAD (a row of a month without one lands in the default partition,
    which then cannot be dropped by month). Any role may: audit_ensure_month runs as the owner and makes only that."""
    month = (now or timezone.now()).astimezone(datetime.UTC).date().replace(day=1)
    with connection.cursor() as cursor:
        for _ in range(MONTHS_AHEAD + 1):
            cursor.execute("SELECT audit_ensure_month(%s)", [month])
            month = (month + datetime.timedelta(days=32)).replace(day=1)


def database_role() -> tuple[str, bool]:
    """The role this connection runs as, and whether it may act as the audit table's owner."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_user, pg_has_role(current_user, relowner, 'USAGE') FROM pg_class"
            " WHERE oid = 'audit_auditevent'::regclass"
        )
        return cursor.fetchone()


def require_owner() -> str:
    role, owner = database_role()
    if not owner:
        raise RetentionRefused(
            f"the database role {role!r} does not own the audit trail: only its owner (the role migrate runs as) may"
            " archive or drop a month; the application's own role never can (README: Audit trail)."
        )
    return role


def expired_months(*, now: datetime.datetime) -> list[str]:
    """Months with rows that are past TASKHUB_AUDIT_RETENTION_MONTHS (none when it is 0: kept forever)."""
    keep = settings.TASKHUB_AUDIT_RETENTION_MONTHS
    if keep <= 0:
        return []
    first_kept = now.astimezone(datetime.UTC).year * 12 + now.astimezone(datetime.UTC).month - 1 - keep
    return [month for month in chain.months_present() if _index(month) < first_kept]


def _index(month: str) -> int:
    if not MONTH.fullmatch(month):
        raise RetentionRefused(f"{month!r} is not a month: write it YYYY-MM (2025-11).")
    year, number = map(int, month.split("-"))
    return year * 12 + number - 1


def archive_month(*, month: str, directory: Path | str, now: datetime.datetime | None = None) -> Archive:
    """Write `month` (YYYY-MM, a month already over) to `directory`/taskhub-audit-YYYY-MM.jsonl: a header line with its
    row count and chain head, then its rows by id. Refused when its chain is not whole (an archive that says so would
    be worth nothing)."""
    role = require_owner()
    now = now or timezone.now()
    if _index(month) >= _index(f"{now.astimezone(datetime.UTC):%Y-%m}"):
        raise RetentionRefused(f"{month} is not over yet: only a past month can be archived.")
    start, end = chain.month_bounds(month)
    directory = Path(directory)
    path = directory / f"taskhub-audit-{month}.jsonl"
    partial = directory / f".{path.name}.partial"
    digest = hashlib.sha256()
    chain.seal_committed()  # before the snapshot (sealing needs READ COMMITTED)
    with partial.open("w", encoding="utf-8") as file, transaction.atomic():
        with connection.cursor() as cursor:  # the header and the rows from one snapshot, a late row or not
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        walked = chain.verify_month(month)
        if not walked.whole:
            raise RetentionRefused(f"{month}: its chain is broken ({walked.problem}); not archived.")
        if walked.unsealed:
            raise RetentionRefused(f"{month}: {walked.unsealed} row(s) were written meanwhile; archive it again.")
        header = {"taskhub_audit_archive": 1, "month": month, "rows": walked.rows, "head": walked.head}
        events = AuditEvent.objects.filter(time__gte=start, time__lt=end).order_by(*chain.CHAIN_ORDER_FIELDS)
        lines = [json.dumps(header)]
        for event in with_data_text(events).iterator(chunk_size=2000):
            lines.append(export_line(export_row(event)))
            if len(lines) >= 2000:
                _write(file, digest, lines)
        _write(file, digest, lines)
        file.flush()
        os.fsync(file.fileno())
    partial.replace(path)
    archive = Archive(month=month, path=path, rows=walked.rows, head=walked.head, sha256=digest.hexdigest())
    with transaction.atomic():
        record_event(
            action="audit.archived",
            actor_label=SYSTEM,
            data={
                "month": month,
                "rows": archive.rows,
                "head": archive.head,
                "file": str(path),
                "sha256": archive.sha256,
                "database_role": role,
            },
        )
    return archive


def drop_month(*, month: str, now: datetime.datetime | None = None) -> int:
    """Drop the partition of an archived month past retention; return how many rows went."""
    role = require_owner()
    _index(month)  # a month, written YYYY-MM
    if month not in expired_months(now=now or timezone.now()):
        keep = settings.TASKHUB_AUDIT_RETENTION_MONTHS
        raise RetentionRefused(
            f"{month} is within TASKHUB_AUDIT_RETENTION_MONTHS ({keep or 'unset: keep forever'}) or has no rows."
        )
    partition = f"audit_auditevent_{month.replace('-', '_')}"
    archived = AuditEvent.objects.filter(action="audit.archived", data__month=month).order_by("-time", "-id").first()
    if archived is None:
        raise RetentionRefused(f"{month} has no archive: run `manage.py audit archive {month} --to DIR` first.")
    chain.seal_committed()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_inherits WHERE inhparent = 'audit_auditevent'::regclass AND inhrelid = to_regclass(%s)",
            [partition],
        )
        if cursor.fetchone() is None:
            raise RetentionRefused(f"{month} has no partition of its own (its rows are in the default one).")
        cursor.execute(f'LOCK TABLE "{partition}" IN ACCESS EXCLUSIVE MODE')
        now_there = chain.verify_month(month)
        if now_there.unsealed or (now_there.rows, now_there.head) != (archived.data["rows"], archived.data["head"]):
            raise RetentionRefused(
                f"{month} changed since its archive ({archived.data['rows']} rows then, {now_there.rows} now):"
                " archive it again."
            )
        cursor.execute(f'DROP TABLE "{partition}"')
        record_event(
            action="audit.partition_dropped",
            actor_label=SYSTEM,
            data={
                "month": month,
                "rows": now_there.rows,
                "head": now_there.head,
                "archive": archived.data["file"],
                "archive_sha256": archived.data["sha256"],
                "database_role": role,
            },
        )
    return now_there.rows


def _write(file, digest, lines: list[str]) -> None:
    if lines:
        text = "".join(f"{line}\n" for line in lines)
        file.write(text)
        digest.update(text.encode())
        lines.clear()
