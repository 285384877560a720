"""`manage.py audit verify | archive MONTH --to DIR | drop MONTH | retain --to DIR`: the audit trail's integrity and
retention (README: Audit trail). verify runs as any role; archive, drop and retain as the database owner only."""

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from taskhub.audit import chain, retention


class Command(BaseCommand):
    help = "Verify the audit trail's hash chains; archive and drop months past TASKHUB_AUDIT_RETENTION_MONTHS."

    def add_arguments(self, parser):
        commands = parser.add_subparsers(dest="command", required=True)
        commands.add_parser("verify", help="whether each month's chain is whole, else its first broken row")
        archive = commands.add_parser("archive", help="write a past month to DIR as JSONL with its chain head")
        archive.add_argument("month", help="YYYY-MM")
        archive.add_argument("--to", required=True, help="the directory the archive is written to")
        drop = commands.add_parser("drop", help="drop an archived month past retention (the owner only)")
        drop.add_argument("month", help="YYYY-MM")
        retain = commands.add_parser("retain", help="archive to DIR and drop every month past retention")
        retain.add_argument("--to", required=True, help="the directory the archives are written to")

    def handle(self, *args, command, **options):
        try:
            return getattr(self, command)(**options)
        except retention.RetentionRefused as refusal:
            raise CommandError(f"refused: {refusal}") from None

    def verify(self, **options):
        months = chain.verify_all()
        for month in months:
            state = "whole" if month.whole else f"BROKEN at row {month.broken_at}: {month.problem}"
            self.stdout.write(f"{month.month}: {month.rows} rows, head {month.head or '-'}: {state}")
        broken = [month for month in months if not month.whole]
        if broken:
            raise CommandError(f"the audit trail is broken in {len(broken)} month(s)")
        self.stdout.write(f"whole: {len(months)} month(s)")

    def archive(self, *, month, to, **options):
        made = retention.archive_month(month=month, directory=to)
        self.stdout.write(f"archived {made.month}: {made.rows} rows, head {made.head}, to {made.path}")

    def drop(self, *, month, **options):
        rows = retention.drop_month(month=month)
        self.stdout.write(f"dropped {month}: {rows} rows")

    def retain(self, *, to, **options):
        retention.require_owner()
        months = retention.expired_months(now=timezone.now())
        for month in months:
            self.archive(month=month, to=to)
            self.drop(month=month)
        self.stdout.write(f"{len(months)} month(s) archived and dropped")
