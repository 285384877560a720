"""Code of taskhub that leans on another project's internals fails a test as soon as the installed version differs
from the one it was written against (issue 30, item 7): each fork is read again before an upgrade lands."""

import datetime
import hashlib
import importlib.metadata
import inspect
import json
import uuid

import django
import psycopg
import pytest
from django.core.handlers.asgi import ASGIHandler
from django.db import connection, transaction

from taskhub import procrastinate_sql
from taskhub.database import loading
from taskhub.servers.hooks import DEFAULT_QUEUE
from taskhub.servers.models import Server, Transport
from taskhub.tasks import hooks, raw_rows
from taskhub.tasks.models import InputRequest, Task
from taskhub.web import request_threads


def test_the_request_handler_fork_matches_the_installed_django():
    assert django.VERSION[:2] == request_threads.FORKED_FROM_DJANGO, "read OneTripHandler.handle against the new Django"
    source = inspect.getsource(ASGIHandler.handle)
    assert hashlib.sha256(source.encode()).hexdigest() == request_threads.FORKED_HANDLE_SHA256, (
        "Django's ASGIHandler.handle changed: port the change to taskhub.web.request_threads.OneTripHandler.handle, "
        "then record the new hash"
    )


def test_procrastinates_version_is_the_one_taskhubs_sql_was_written_for():
    installed = tuple(int(part) for part in importlib.metadata.version("procrastinate").split(".")[:2])
    assert installed == procrastinate_sql.WRITTEN_FOR, "read taskhub/procrastinate_sql.py against the new version"


@pytest.mark.django_db
def test_procrastinates_schema_has_what_taskhubs_sql_uses():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_function_identity_arguments(oid) FROM pg_proc WHERE proname = 'procrastinate_retry_job_v2'"
        )
        (arguments,) = cursor.fetchone()
        assert arguments.count(",") == 4  # (job_id, retry_at, new_priority, new_queue_name, new_lock)
        cursor.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'procrastinate_jobs'"
            " AND column_name IN ('attempts', 'status', 'lock', 'task_name', 'queue_name', 'scheduled_at', 'worker_id')"
        )
        assert {row[0] for row in cursor.fetchall()} == {
            "attempts",
            "status",
            "lock",
            "task_name",
            "queue_name",
            "scheduled_at",
            "worker_id",
        }


@pytest.mark.django_db
def test_every_statement_taskhub_sends_to_procrastinate_runs_on_its_schema():
    """Each statement of taskhub/procrastinate_sql.py against the installed schema, on one job of each kind it acts on
    (a waiting launch, a running job of a silent runner, a job left in a stdio server's queue)."""
    with connection.cursor() as cursor:

        def job(status: str, *, lock: str | None = None, queue: str = "default", attempts: int = 0) -> int:
            cursor.execute(
                "INSERT INTO procrastinate_jobs (queue_name, task_name, lock, args, status, attempts)"
                " VALUES (%s, 'taskhub.probe', %s, '{}', %s, %s) RETURNING id",
                [queue, lock, status, attempts],
            )
            return cursor.fetchone()[0]

        waiting = job("todo", lock="launch:probe")
        assert procrastinate_sql.cancel_waiting(cursor, lock="launch:probe", task_name="taskhub.probe") == 1
        found = procrastinate_sql.locks_with_jobs(
            cursor, locks=["launch:probe", "launch:none"], task_name="taskhub.probe"
        )
        assert found == {"launch:probe"}  # whatever its state (this one cancelled)
        running = job("doing", attempts=2)
        procrastinate_sql.give_back_attempt(cursor, job_id=running)
        cursor.execute("SELECT attempts FROM procrastinate_jobs WHERE id = %s", [running])
        assert cursor.fetchone() == (1,)
        assert (running, "taskhub.probe") in procrastinate_sql.retry_stalled_jobs(cursor, stalled=datetime.timedelta(0))
        cursor.execute(
            "SELECT id, status::text FROM procrastinate_jobs WHERE id IN (%s, %s) ORDER BY id", [waiting, running]
        )
        assert cursor.fetchall() == [(waiting, "cancelled"), (running, "todo")]
        job("todo", queue="stdio-999999")
        moved = procrastinate_sql.requeue_if_no_longer_stdio(
            cursor, server_id=999999, queue="stdio-999999", to="default"
        )
        assert moved == 1
        cursor.execute(procrastinate_sql.JOBS_SQL)
        assert ("taskhub.probe", "todo", 2) in cursor.fetchall()
        cursor.execute(procrastinate_sql.JOB_WAITS_SQL, [["taskhub.probe"]])
        assert [name for name, _ in cursor.fetchall()] == ["taskhub.probe"]


@pytest.mark.django_db(transaction=True)
def test_a_job_inserted_for_later_is_not_announced_and_one_due_now_is():
    """procrastinate's trigger as taskhub's migration tasks/0025 changed it: a job scheduled for later (the fallback of
    a call the gateway sends) wakes no job runner; a job due now does, as before. Each deferred and committed as the
    services do."""
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as listener:
        listener.execute(f'LISTEN "procrastinate_queue_v1#{DEFAULT_QUEUE}"')
        later, now = uuid.uuid4(), uuid.uuid4()
        hooks.enqueue_launch(later, not_before_seconds=60)
        hooks.enqueue_launch(now)
        announced = [json.loads(note.payload)["job_id"] for note in listener.notifies(timeout=10, stop_after=1)]
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM procrastinate_jobs WHERE lock = %s", [f"launch:{now}"])
        assert announced == [cursor.fetchone()[0]]


def test_the_raw_rows_fork_matches_the_installed_django():
    assert django.VERSION[:2] == raw_rows.FORKED_FROM_DJANGO, "read taskhub.tasks.raw_rows against the new Django"


@pytest.mark.django_db
def test_instances_built_from_a_raw_row_equal_the_orms_and_follow_their_relations_without_a_query(
    django_assert_num_queries,
):
    server = Server.objects.create(
        name="forked", transport=Transport.HTTP, url="http://127.0.0.1:9/mcp", headers={"X-Key": "secret"}
    )
    task = Task.objects.create(server=server, tool="deploy", arguments={"to": ["a", 1, None]})
    request = InputRequest.objects.create(task=task, key="k", method="elicitation/create", params={"message": "ok?"})
    models = (("request", InputRequest), ("task", Task), ("server", Server))
    selected = ", ".join(column for alias, model in models for column in raw_rows.columns(alias, model))
    with connection.cursor() as cursor:
        cursor.execute(
            f'SELECT {selected} FROM "{InputRequest._meta.db_table}" AS request '
            f'JOIN "{Task._meta.db_table}" AS task ON task.id = request.task_id '
            f'JOIN "{Server._meta.db_table}" AS server ON server.id = task.server_id WHERE request.id = %s',
            [request.pk],
        )
        row = cursor.fetchone()
    built_request, built_task, built_server = raw_rows.instances(row, (InputRequest, Task, Server))
    raw_rows.relate(built_task, "server", built_server)
    raw_rows.relate(built_request, "task", built_task)
    for built, model in ((built_request, InputRequest), (built_task, Task), (built_server, Server)):
        from_orm = model.objects.get(pk=built.pk)
        for field in model._meta.concrete_fields:
            assert getattr(built, field.attname) == getattr(from_orm, field.attname), (model, field.name)
        assert not built._state.adding and built._state.db == "default"
    with django_assert_num_queries(0):
        assert built_request.task.server.headers == {"X-Key": "secret"}


@pytest.mark.django_db
def test_the_live_sockets_task_read_equals_the_orms_select_related_and_says_whether_it_asks(
    django_assert_num_queries,
):
    """taskhub.live.consumer._task_or_none: one hand-written statement for what
    select_related("server", "launched_by", "cancel_requested_by", "poll") reads, with `asks`."""
    from django.contrib.auth.models import User
    from django.utils import timezone

    from taskhub.live.consumer import _task_or_none
    from taskhub.tasks.models import TaskPoll

    server = Server.objects.create(name="forked", transport=Transport.HTTP, url="http://127.0.0.1:9/mcp")
    launcher, canceller = User.objects.create(username="launcher"), User.objects.create(username="canceller")
    bare = Task.objects.create(server=server, tool="deploy", arguments={})
    full = Task.objects.create(
        server=server, tool="deploy", arguments={"to": 1}, launched_by=launcher, cancel_requested_by=canceller
    )
    TaskPoll.objects.create(task=full, next_poll_at=timezone.now())
    InputRequest.objects.create(task=full, key="k", method="elicitation/create", params={"message": "ok?"})
    relations = ("server", "launched_by", "cancel_requested_by", "poll")
    for task, asks in ((bare, False), (full, True)):
        with django_assert_num_queries(1):
            read = _task_or_none(task.pk)
        from_orm = Task.objects.select_related(*relations).get(pk=task.pk)
        for field in Task._meta.concrete_fields:
            assert getattr(read, field.attname) == getattr(from_orm, field.attname), field.name
        with django_assert_num_queries(0):
            assert read.asks is asks
            assert read.server == from_orm.server and read.server.url == "http://127.0.0.1:9/mcp"
            assert read.launched_by == from_orm.launched_by
            assert read.cancel_requested_by == from_orm.cancel_requested_by
            if asks:
                assert read.poll.next_poll_at == from_orm.poll.next_poll_at and read.poll.task is read
            else:
                with pytest.raises(TaskPoll.DoesNotExist):
                    read.poll  # noqa: B018 (as select_related leaves a missing one)
    assert _task_or_none(uuid.uuid4()) is None and _task_or_none("not-a-uuid") is None


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("with_asks", [True, False])
def test_a_services_locked_read_equals_the_orms_and_holds_the_rows_lock(django_assert_num_queries, with_asks):
    """tasks.services.common._locked_with_asks and _locked: one hand-written statement each for what
    select_for_update(no_key=True), with .annotate(asks=has_input_requests()) or without, reads, and it locks the row
    as that does."""
    from taskhub.tasks.models import has_input_requests
    from taskhub.tasks.services.common import _locked, _locked_with_asks

    locked_read = _locked_with_asks if with_asks else _locked

    server = Server.objects.create(name="forked", transport=Transport.HTTP, url="http://127.0.0.1:9/mcp")
    quiet = Task.objects.create(server=server, tool="deploy", arguments={"to": [1, None]})
    asking = Task.objects.create(server=server, tool="deploy", arguments={})
    InputRequest.objects.create(task=asking, key="k", method="elicitation/create", params={"message": "ok?"})
    for task, asks in ((quiet, False), (asking, True)):
        with transaction.atomic():
            with django_assert_num_queries(1):
                locked = locked_read(task)
            from_orm = Task.objects.annotate(asks=has_input_requests()).get(pk=task.pk)
            assert from_orm.asks is asks and (locked.asks is asks if with_asks else not hasattr(locked, "asks"))
            assert locked._state.adding is False and locked._state.db == "default"
            for field in Task._meta.concrete_fields:
                assert getattr(locked, field.attname) == getattr(from_orm, field.attname), field.name
            # Held until the transaction ends: another session cannot lock the row meanwhile.
            lock = f'SELECT 1 FROM "{Task._meta.db_table}" WHERE id = %s FOR NO KEY UPDATE NOWAIT'
            with (
                psycopg.connect(**connection.get_connection_params(), autocommit=True) as other,
                pytest.raises(psycopg.errors.LockNotAvailable),
            ):
                other.execute(lock, [task.pk])
    with pytest.raises(Task.DoesNotExist), transaction.atomic():
        locked_read(Task(pk=uuid.uuid4()))


@pytest.mark.django_db(transaction=True)
def test_the_answers_locked_read_equals_the_orms_and_holds_both_rows_locks(django_assert_num_queries):
    """tasks.services.answering.locked_for_answer: one hand-written statement for what the ORM's
    select_for_update(no_key=True, of=("task", "self")).select_related("task__server") reads; it locks the task's
    row and the request's as that does, and its task and server are read with it."""
    from taskhub.tasks.services.answering import locked_for_answer

    server = Server.objects.create(name="forked", transport=Transport.HTTP, url="http://127.0.0.1:9/mcp")
    task = Task.objects.create(server=server, tool="deploy", arguments={"to": [1, None]})
    request = InputRequest.objects.create(
        task=task, key="k", method="elicitation/create", params={"message": "ok?", "requestedSchema": {}}
    )
    with transaction.atomic():
        with django_assert_num_queries(1):
            locked = locked_for_answer(input_request_id=request.pk)
            assert locked.task.server.name == "forked"
        from_orm = InputRequest.objects.select_related("task__server").get(pk=request.pk)
        for built, read in (
            (locked, from_orm),
            (locked.task, from_orm.task),
            (locked.task.server, from_orm.task.server),
        ):
            for field in type(read)._meta.concrete_fields:
                assert getattr(built, field.attname) == getattr(read, field.attname), field.name
        for table, pk in ((Task._meta.db_table, task.pk), (InputRequest._meta.db_table, request.pk)):
            with (
                psycopg.connect(**connection.get_connection_params(), autocommit=True) as other,
                pytest.raises(psycopg.errors.LockNotAvailable),
            ):
                other.execute(f'SELECT 1 FROM "{table}" WHERE id = %s FOR NO KEY UPDATE NOWAIT', [pk])
    with pytest.raises(InputRequest.DoesNotExist), transaction.atomic():
        locked_for_answer(input_request_id=request.pk + 1000)


@pytest.mark.django_db
def test_the_session_store_reads_what_djangos_reads_in_one_statement(django_assert_num_queries):
    """taskhub.accounts.sessions overrides the database store's `_get_session_from_db` (Django's internals): a live
    session reads as Django's store reads it, a missing or expired one as nothing, its key forgotten."""
    from django.contrib.sessions.backends.db import SessionStore as DjangosStore
    from django.utils import timezone

    from taskhub.accounts.sessions import SessionStore

    live = DjangosStore()
    live.update({"_auth_user_id": "7", "said": ["é", 1]})
    live.create()
    expired = DjangosStore()
    expired["_auth_user_id"] = "8"
    expired.create()
    expired.model.objects.filter(session_key=expired.session_key).update(
        expire_date=timezone.now() - datetime.timedelta(seconds=1)
    )
    for key in (live.session_key, expired.session_key, "nosuchsessionkey0000000000000000"):
        ours, djangos = SessionStore(key), DjangosStore(key)
        with django_assert_num_queries(1):
            read = ours.load()
        assert read == djangos.load()
        assert ours.session_key == djangos.session_key
    assert SessionStore(live.session_key).load() == {"_auth_user_id": "7", "said": ["é", 1]}


@pytest.mark.django_db
def test_a_page_of_cards_read_by_ids_equals_the_orms_for_cards(django_assert_num_queries):
    """tasks.card_requests.requests_for_cards: one hand-written statement for what input_cards.for_cards
    (select_related of the task, its server, the answerer and the group, only what cards read of the task and server)
    reads, in the inbox's order; an answerer and a group where the request has them, None where not, and nothing
    more read after."""
    from django.contrib.auth.models import Group, User
    from django.utils import timezone

    from taskhub.tasks.card_requests import requests_for_cards
    from taskhub.tasks.input_cards import for_cards

    server = Server.objects.create(name="forked", transport=Transport.HTTP, url="http://127.0.0.1:9/mcp")
    ada, admins = User.objects.create(username="ada"), Group.objects.create(name="release managers")
    task = Task.objects.create(server=server, tool="deploy", arguments={"to": [1, None]}, status_message="halfway")
    now = timezone.now()
    asked = [
        InputRequest.objects.create(task=task, key=f"k{n}", method="elicitation/create", params={"message": f"{n}?"})
        for n in range(3)
    ]
    for request, minutes_ago in zip(asked, (0, 5, 1), strict=True):  # created_at is the database's on insert
        InputRequest.objects.filter(pk=request.pk).update(created_at=now - datetime.timedelta(minutes=minutes_ago))
    InputRequest.objects.filter(pk=asked[1].pk).update(
        state="answered", answered_by=ada, answered_at=now, answer={"action": "accept", "content": {}}
    )
    InputRequest.objects.filter(pk=asked[2].pk).update(escalated_to=admins)
    ids = [request.pk for request in asked]
    with django_assert_num_queries(1):
        read = requests_for_cards(ids)
    from_orm = list(for_cards(InputRequest.objects.filter(pk__in=ids)).order_by("created_at", "pk"))
    assert [request.pk for request in read] == [request.pk for request in from_orm] == [ids[1], ids[2], ids[0]]
    for built, orm in zip(read, from_orm, strict=True):
        for field in InputRequest._meta.concrete_fields:
            assert getattr(built, field.attname) == getattr(orm, field.attname), field.name
        assert built.get_deferred_fields() == orm.get_deferred_fields() == set()
        assert built.task.get_deferred_fields() == orm.task.get_deferred_fields()
        assert built.task.server.get_deferred_fields() == orm.task.server.get_deferred_fields()
        with django_assert_num_queries(0):
            assert (built.task.tool, built.task.status_message, built.task.arguments) == (
                "deploy",
                "halfway",
                {"to": [1, None]},
            )
            assert built.task.server.name == "forked" and built.task.server.removed_at is None
            assert built.answered_by == orm.answered_by and built.escalated_to == orm.escalated_to
            assert not built._state.adding and built._state.db == "default"
    assert read[0].answered_by.username == "ada" and read[1].escalated_to.name == "release managers"
    assert requests_for_cards([]) == [] and requests_for_cards([ids[0] + 1000]) == []


def test_the_loading_fork_matches_the_installed_django():
    assert django.VERSION[:2] == loading.FORKED_FROM_DJANGO, "read taskhub.database.loading against the new Django"


@pytest.mark.django_db
def test_models_loaded_plainly_build_as_djangos_from_db_and_let_it_build_where_a_signal_listens():
    """taskhub.database.loading builds instances without Model.__init__ where nothing tells them apart (every field
    stored in the instance's __dict__, no pre_init or post_init receiver): the same __dict__ and state as Django's
    from_db, read whole, in part or through the ORM; with a receiver, Django builds them, and the receiver hears of
    each."""
    from django.contrib.auth.models import Group, User
    from django.db.models import Model
    from django.db.models.signals import post_init

    from taskhub.api.models import ApiToken
    from taskhub.approvals.models import ApprovalPolicy
    from taskhub.audit.models import AuditEvent
    from taskhub.tasks.models import TaskPoll

    for model in (Task, InputRequest, Server, TaskPoll, AuditEvent, ApiToken, ApprovalPolicy, User, Group):
        assert loading.plainly_stored(model), model  # the pages', the services' and raw_rows' reads take it
    for model in (Task, InputRequest, Server, TaskPoll, AuditEvent, ApiToken, ApprovalPolicy):
        assert model.from_db.__func__ is loading.LoadedPlainly.from_db.__func__, model

    def djangos(model, columns, values):
        return Model.from_db.__func__(model, "default", columns, values)

    whole = [field.attname for field in Task._meta.concrete_fields]
    in_part = [field.attname for field in raw_rows._fields(Task, ("server", "tool", "status"))]
    task_id = uuid.uuid4()
    for columns, values in (
        (in_part, [task_id, 7, "deploy", "working"]),
        (list(reversed(whole)), list(range(len(whole)))),  # every field's: read as theirs in order, as Django does
    ):
        built = loading.from_db(Task, "default", columns, values)
        by_django = djangos(Task, columns, values)
        assert {k: v for k, v in built.__dict__.items() if k != "_state"} == {
            k: v for k, v in by_django.__dict__.items() if k != "_state"
        }
        assert built.get_deferred_fields() == by_django.get_deferred_fields()
        assert (built._state.adding, built._state.db) == (by_django._state.adding, by_django._state.db)
        assert (built._state.adding, built._state.db) == (False, "default")

    server = Server.objects.create(name="loaded", transport=Transport.HTTP, url="http://127.0.0.1:9/mcp")
    task = Task.objects.create(server=server, tool="deploy", arguments={"to": [1, None]})
    read = Task.objects.select_related("server").only("tool", "server__name").get(pk=task.pk)
    assert read.get_deferred_fields() == {f.attname for f in Task._meta.concrete_fields} - {"id", "tool", "server_id"}
    assert (read.tool, read.server.name, read._state.adding, read._state.db) == ("deploy", "loaded", False, "default")
    assert read.arguments == {"to": [1, None]}  # a deferred field is read when asked, as Django reads it

    heard = []

    def receiver(sender, instance, **kwargs):
        heard.append(instance)

    post_init.connect(receiver, sender=Task)
    try:
        listened = loading.from_db(Task, "default", in_part, [task_id, 7, "deploy", "working"])
        through_the_orm = Task.objects.get(pk=task.pk)
    finally:
        post_init.disconnect(receiver, sender=Task)
    assert heard == [listened, through_the_orm] and listened.tool == "deploy"


@pytest.mark.django_db
def test_a_page_of_list_rows_read_by_ids_equals_the_orms_rows(django_assert_num_queries):
    """tasks.list_rows.rows_by_ids: one hand-written statement for what the list's rows read through the ORM
    (outcomes.with_row_facts, select_related of the server, the launcher and who asked to cancel, only(ROW_FIELDS)),
    the facts included, in the order of the ids given, a task gone left out; nothing more read after."""
    from django.contrib.auth.models import User

    from taskhub.tasks.list_rows import rows_by_ids
    from taskhub.tasks.outcomes import ROW_FACTS, ROW_FIELDS, with_row_facts

    server = Server.objects.create(name="listed", transport=Transport.HTTP, url="http://127.0.0.1:9/mcp")
    ada, bo = User.objects.create(username="ada"), User.objects.create(username="bo")
    text = "x" * 300
    tasks = [
        Task.objects.create(server=server, tool="plain", arguments={}),
        Task.objects.create(
            server=server,
            tool="done",
            arguments={},
            launched_by=ada,
            status="completed",
            result={"content": [{"type": "text", "text": text}], "isError": True},
        ),
        Task.objects.create(
            server=server,
            tool="odd",
            arguments={},
            launched_by=ada,
            cancel_requested_by=bo,
            status="completed",
            result={"content": [], "isError": "true"},
        ),
        Task.objects.create(
            server=server,
            tool="failed",
            arguments={},
            status="failed",
            error={"code": "c" * 60, "kind": "not_approved", "message": "no"},
            status_message="it broke",
        ),
    ]
    ids = [tasks[2].pk, tasks[0].pk, uuid.uuid4(), tasks[3].pk, tasks[1].pk]
    with django_assert_num_queries(1):
        read = rows_by_ids(ids)
    orm = with_row_facts(Task.objects.filter(pk__in=ids)).select_related("server", "launched_by", "cancel_requested_by")
    by_orm = {task.pk: task for task in orm.only(*ROW_FIELDS)}
    assert [task.pk for task in read] == [tasks[2].pk, tasks[0].pk, tasks[3].pk, tasks[1].pk]
    for built in read:
        from_orm = by_orm[built.pk]
        assert built.get_deferred_fields() == from_orm.get_deferred_fields()
        for field in Task._meta.concrete_fields:
            if field.attname not in from_orm.get_deferred_fields():
                assert getattr(built, field.attname) == getattr(from_orm, field.attname), field.name
        with django_assert_num_queries(0):
            for fact in ROW_FACTS:
                assert getattr(built, fact) == getattr(from_orm, fact), fact
            assert (
                built.server.name == "listed"
                and built.server.get_deferred_fields() == from_orm.server.get_deferred_fields()
            )
            for person in ("launched_by", "cancel_requested_by"):
                mine, theirs = getattr(built, person), getattr(from_orm, person)
                assert (mine and mine.username) == (theirs and theirs.username), person
    assert read[3].result_is_error is True and read[0].result_is_error == "true" and read[1].result_is_error is None
    assert len(read[3].result_preview) == 200 and len(read[2].error_code) == 40 and read[2].error_kind == "not_approved"
    assert rows_by_ids([]) == []
