"""Issue 36: the audit trail records decisions, not progress ticks; it is a hash chain anyone can verify, the database
owner included; it lives in monthly partitions the owner archives and drops, the application's role never."""

import datetime
import importlib.util
import io
import json
import threading
from functools import partial
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, OperationalError, connection, transaction
from django.urls import reverse
from django.utils import timezone

from taskhub.accounts.groups import ADMINS
from taskhub.audit import chain, retention
from taskhub.audit.models import AuditEvent
from taskhub.audit.services import record_event
from taskhub.mcp.client import TaskCreated
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks import presenters, services
from taskhub.tasks.models import ProgressMessage
from taskhub.tasks.services.progress import PROGRESS_MESSAGES_KEPT, PROGRESS_OLDER_KEPT, record_progress
from tests.account_fixtures import make_user
from tests.catalogue_fixtures import with_tools
from tests.helpers import snapshot as snapshot_any_time

pytestmark = pytest.mark.django_db

snapshot = partial(snapshot_any_time, last_updated_at="2026-07-28T10:00:01Z")


@pytest.fixture
def live(django_user_model):
    server = create_server(name="demo", transport="http", url="http://127.0.0.1:8765/mcp", user=None)
    with_tools(server, "slow_compute")
    task = services.launch(server=server, tool="slow_compute", arguments={}, user=django_user_model.objects.create())
    return services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot()))


def test_900_progress_messages_leave_a_handful_of_audit_rows_and_the_timeline_shows_the_last(live):
    for second in range(900, 0, -1):
        services.apply_snapshot(task=live, snapshot=snapshot(statusMessage=f"{second} s of 900 s"))
    # notifications/progress (any revision, a classic call's too): a new message joins the history, a repeat does not
    for message in ("copying", "copying", "indexing"):
        record_progress(task_id=live.pk, progress=1, total=2, message=message)
    services.apply_snapshot(task=live, snapshot=snapshot("completed", statusMessage="done", result={"content": []}))

    trail = list(AuditEvent.objects.filter(task_id=live.pk).order_by("id").values_list("action", "data"))
    assert len(trail) <= 10, [action for action, _ in trail]
    assert [action for action, _ in trail] == ["task.launched", "task.launch_answered", "task.status_changed"]
    assert trail[-1][1]["progress_updates"] == 903 and trail[-1][1]["to"] == "completed"

    kept = ProgressMessage.objects.filter(task_id=live.pk)
    assert kept.count() <= PROGRESS_MESSAGES_KEPT + PROGRESS_OLDER_KEPT
    assert kept.filter(text="1 s of 900 s").exists() and kept.filter(text="900 s of 900 s").exists()
    live.refresh_from_db()
    entries, _ = presenters.timeline(live)
    said = [entry.data for entry in entries if entry.action == "task.progress"]
    assert said[-4:] == ["2 s of 900 s", "1 s of 900 s", "copying", "indexing"]
    assert entries[-1].action == "task.status_changed"

    services.purge_finished_tasks(finished_before=timezone.now() + datetime.timedelta(days=1))  # the history goes too
    assert not ProgressMessage.objects.filter(task_id=live.pk).exists()


# --- the hash chain -------------------------------------------------------------------------------------------------

HOSTILE_DATA = {
    'quote"and\\slash/': "tab\there\nnewline\x01\x1f\x7f é 😀 \u2028",
    "n": [0, -1, 1.5, 1.5e-10, 1e20, 12345678901234567890, 0.1, True, False, None],
    "nested": {"b": {}, "aa": [], "a": {"zz": "", "z": "<script>"}},
}


def verifier():
    path = Path(__file__).resolve().parent.parent / "scripts" / "verify_audit_export.py"
    spec = importlib.util.spec_from_file_location("verify_audit_export", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def chained_rows(admin) -> list[AuditEvent]:
    with transaction.atomic():
        events = [record_event(action="server.updated", user=admin, data={"step": n, **HOSTILE_DATA}) for n in range(5)]
        events.append(record_event(action="server.created", data={}))
    return events


def as_owner_broken(statement: str, params) -> chain.MonthChain:
    """`statement` run as the database owner with every trigger off, the chain verified, all rolled back."""
    chain.seal_committed()
    month = f"{timezone.now().astimezone(datetime.UTC):%Y-%m}"
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL session_replication_role = replica")
            cursor.execute(statement, params)
            found = chain.verify_month(month)
            raise RuntimeError("rolled back")
    except RuntimeError:
        pass
    return found


def test_the_chain_finds_an_edit_a_deleted_row_and_a_reordering_and_an_export_verifies_offline(client, tmp_path):
    admin = make_user("alex", ADMINS)
    events = chained_rows(admin)
    ids = [event.pk for event in events]
    assert all(month.whole for month in chain.verify_all())
    out = io.StringIO()
    call_command("audit", "verify", stdout=out)
    assert out.getvalue().rstrip().endswith("whole: 1 month(s)")

    edited = as_owner_broken("UPDATE audit_auditevent SET data = data || '{\"step\": 9}' WHERE id = %s", [ids[2]])
    assert (edited.broken_at, "changed") == (ids[2], edited.problem.split(": it was ")[1][:7])
    deleted = as_owner_broken("DELETE FROM audit_auditevent WHERE id = %s", [ids[2]])
    assert deleted.broken_at == ids[3] and "missing" in deleted.problem
    # Two rows' places in the chain swapped (seq), each row's own content untouched: ids[2] now comes first.
    swap = (
        "UPDATE audit_auditevent SET seq = (SELECT sum(seq) FROM audit_auditevent WHERE id IN (%(a)s, %(b)s)) - seq"
        " WHERE id IN (%(a)s, %(b)s)"
    )
    reordered = as_owner_broken(swap, {"a": ids[1], "b": ids[2]})
    assert reordered.broken_at == ids[2] and f"follows row {ids[1]} in the chain but not in order" in reordered.problem
    # Or two rows' ids swapped: each row's content (its id is in it) no longer matches its hash.
    swap_ids = "UPDATE audit_auditevent SET id = CASE id WHEN %s THEN %s ELSE %s END WHERE id IN (%s, %s)"
    renumbered = as_owner_broken(swap_ids, [ids[1], ids[2], ids[1], ids[1], ids[2]])
    assert renumbered.problem.endswith("it was changed (or given another row's id or time)")
    # What the command says of it, the same walk:
    with pytest.raises(CommandError, match="broken in 1 month"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute("DELETE FROM audit_auditevent WHERE id = %s", [ids[0]])
        call_command("audit", "verify", stdout=io.StringIO())
    assert all(month.whole for month in chain.verify_all())

    client.force_login(admin)
    assert "<strong>Whole:</strong>" in client.get(reverse("audit:verify")).content.decode()
    with transaction.atomic(), connection.cursor() as cursor:  # the admin page says what the command says
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute("DELETE FROM audit_auditevent WHERE id = %s", [ids[4]])
        page = client.get(reverse("audit:verify")).content.decode()
        transaction.set_rollback(True)
    assert f"broken at row {ids[5]}: a row is missing before row {ids[5]}" in page
    response = client.get(reverse("audit:export", args=["json"]), {"made_by": "all"})
    with pytest.warns(Warning, match="StreamingHttpResponse must consume asynchronous iterators"):
        exported = b"".join(response).decode()
    (tmp_path / "export.json").write_text(exported, encoding="utf-8")
    script = verifier()
    assert script.main([str(tmp_path / "export.json")]) == 0
    assert json.loads(exported)[1]["data"]["nested"]["a"]["z"] == "<script>"
    (tmp_path / "edited.json").write_text(exported.replace('"step": 3', '"step": 4'), encoding="utf-8")
    assert script.main([str(tmp_path / "edited.json")]) == 1


# --- retention --------------------------------------------------------------------------------------------------------


def months_ago(count: int) -> datetime.datetime:
    month = timezone.now().astimezone(datetime.UTC).replace(day=15, hour=12, minute=0, second=0, microsecond=0)
    for _ in range(count):
        month = (month.replace(day=1) - datetime.timedelta(days=1)).replace(day=15)
    return month


@pytest.mark.django_db(transaction=True)
def test_the_owner_archives_and_drops_a_month_past_retention_the_application_role_cannot(
    application_role, settings, tmp_path
):
    old = months_ago(3)
    month = f"{old:%Y-%m}"
    with connection.cursor() as cursor:
        cursor.execute("SELECT audit_ensure_month(%s)", [old.date()])
    with transaction.atomic():  # two writers' rows of an old month, then this month's
        for n in range(4):
            AuditEvent.objects.create(
                time=old + datetime.timedelta(minutes=n), actor_label="alex", action="server.updated"
            )
        record_event(action="server.created", data={"name": "now"})
    partition = f"audit_auditevent_{month.replace('-', '_')}"

    with connection.cursor() as cursor:
        cursor.execute(f"SET ROLE {application_role.name}")
        try:
            retention.ensure_months_ahead(now=timezone.now() + datetime.timedelta(days=200))  # the worker's hourly
            cursor.execute("SELECT count(*) FROM pg_inherits WHERE inhparent = 'audit_auditevent'::regclass")
            assert cursor.fetchone()[0] >= 7  # the default, the old month, this month and the 2 next, then 3 later
            with pytest.raises(retention.RetentionRefused, match="does not own the audit trail"):
                retention.archive_month(month=month, directory=tmp_path)
            for statement in (
                f"DROP TABLE {partition}",
                f"DELETE FROM {partition}",
                f"UPDATE {partition} SET data = '{{}}'",
            ):
                with pytest.raises(DatabaseError, match=r"must be owner|permission denied"), transaction.atomic():
                    cursor.execute(statement)
            # It writes rows unsealed and seals them through audit_seal (which runs as the owner); it cannot fill in a
            # row's place in the chain itself, not even with the setting audit_seal's own UPDATE is let through by.
            with transaction.atomic():
                written = record_event(action="server.updated", data={"by": "the application's role"})
            cursor.execute("SET taskhub.audit_sealing = 'on'")
            for statement in (
                "UPDATE audit_auditevent SET seq = 1, prev_hash = ''::bytea, hash = ''::bytea WHERE id = %s",
                "SELECT audit_auditevent_refuse_change()",
            ):
                refused = r"permission denied|trigger functions can only be called"
                with pytest.raises(DatabaseError, match=refused), transaction.atomic():
                    cursor.execute(statement, [written.pk] if "%s" in statement else None)
            cursor.execute("RESET taskhub.audit_sealing")
            assert chain.seal_committed() >= 1
            assert AuditEvent.objects.get(pk=written.pk).hash is not None
        finally:
            cursor.execute("RESET ROLE")

    with pytest.raises(retention.RetentionRefused, match="keep forever"):  # TASKHUB_AUDIT_RETENTION_MONTHS unset
        retention.drop_month(month=month)
    settings.TASKHUB_AUDIT_RETENTION_MONTHS = 2
    with pytest.raises(retention.RetentionRefused, match="not a month"):
        retention.drop_month(month=f"{month}; DROP TABLE audit_auditevent")
    with pytest.raises(retention.RetentionRefused, match="no archive"):
        retention.drop_month(month=month)
    archive = retention.archive_month(month=month, directory=tmp_path)
    assert (archive.rows, archive.path.name) == (4, f"taskhub-audit-{month}.jsonl")
    assert verifier().main([str(archive.path)]) == 0
    assert retention.drop_month(month=month) == 4

    assert not AuditEvent.objects.filter(time__lt=old + datetime.timedelta(days=20)).exists()
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [partition])
        assert cursor.fetchone()[0] is None
    recorded = dict(AuditEvent.objects.filter(action__startswith="audit.").values_list("action", "data"))
    assert recorded["audit.archived"]["head"] == recorded["audit.partition_dropped"]["head"] == archive.head
    assert recorded["audit.partition_dropped"]["rows"] == 4
    assert all(month.whole for month in chain.verify_all())


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_and_sealers_extend_one_chain_without_forking_it():
    start = threading.Barrier(6)
    writing = threading.Event()

    def write(n: int) -> None:
        start.wait()
        try:
            for step in range(10):
                with transaction.atomic():
                    record_event(action="server.updated", data={"writer": n, "step": step})
        finally:
            connection.close()

    def seal() -> None:  # two sealers, as two workers' sweeps, while the writers write
        start.wait()
        try:
            while writing.is_set():
                chain.seal_committed()
        finally:
            connection.close()

    writing.set()
    writers = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    sealers = [threading.Thread(target=seal) for _ in range(2)]
    for thread in writers + sealers:
        thread.start()
    for thread in writers:
        thread.join()
    writing.clear()
    for thread in sealers:
        thread.join()
    walked = chain.verify_all()
    assert [(month.rows, month.whole, month.unsealed) for month in walked] == [(40, True, 0)], walked
    seqs = list(AuditEvent.objects.order_by("seq").values_list("seq", flat=True))
    assert len(set(seqs)) == 40 and None not in seqs
    # A snapshot older than the sealers' lock would fork the chain: sealing is refused there, as a serialization
    # failure to retry; writing is not (a row is sealed after its commit, by whoever seals next).
    with pytest.raises(OperationalError, match="READ COMMITTED only"), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        record_event(action="server.updated", data={})
        chain.seal_committed()


@pytest.mark.django_db(transaction=True)
def test_a_lock_taken_after_an_audit_row_cannot_deadlock_with_a_writer_that_holds_it():
    """The shape of a launch retry (its audit row, then its server locked to count the failure) against a failure
    recorded for the same server (the server locked, then its audit row). While the chain was made inside the writing
    transaction, the first held the month's chain lock and waited for the server; the second held the server and
    waited for the chain: Postgres failed one of them (a deadlock)."""
    server = create_server(name="demo", transport="http", url="http://127.0.0.1:8765/mcp", user=None)
    audited, locked = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def audit_then_lock() -> None:
        try:
            with transaction.atomic():
                record_event(action="server.updated", server=server, data={"by": "the retry"})
                audited.set()
                assert locked.wait(10)
                Server.objects.select_for_update(no_key=True).get(pk=server.pk)  # waits for the other to commit
        except BaseException as error:
            failures.append(error)
        finally:
            connection.close()

    def lock_then_audit() -> None:
        try:
            assert audited.wait(10)
            with transaction.atomic():
                Server.objects.select_for_update(no_key=True).get(pk=server.pk)
                locked.set()
                record_event(action="server.updated", server=server, data={"by": "the failure"})
        except BaseException as error:
            failures.append(error)
        finally:
            locked.set()
            connection.close()

    threads = [threading.Thread(target=audit_then_lock), threading.Thread(target=lock_then_audit)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    by = AuditEvent.objects.filter(server_id=server.pk, action="server.updated").values_list("data__by", flat=True)
    assert sorted(by) == ["the failure", "the retry"]
    assert all(month.whole for month in chain.verify_all())
