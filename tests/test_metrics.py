"""/metrics in this process (issue 19 items 1 and 2): who may read it, the figures read from Postgres (tasks by
status kept by triggers, the inbox, the job queue, leases, server health), the request counting, and the Grafana
dashboard and alert rules under docs/grafana, whose every expression must use metrics that /metrics exposes.

The same across real processes (two daphnes, two workers, multiprocess mode): tests/test_metrics_stack.py.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import re
import subprocess
import sys
import time

import pytest
import yaml
from django.db import connection
from django.db.models import Count, F
from django.test.utils import CaptureQueriesContext
from procrastinate.job_context import JobContext
from procrastinate.jobs import Job
from prometheus_client import REGISTRY

from taskhub.mcp.errors import TransportError
from taskhub.observability import collectors, counts
from taskhub.observability.jobs import count_job
from taskhub.servers.models import Server, Transport
from taskhub.tasks import services
from taskhub.tasks.hooks import ANSWER_DELIVERY_JOB
from taskhub.tasks.models import InputRequest, InputRequestState, Task, TaskPoll, TaskStatus
from taskhub.worker.jobs import DELIVERY_RETRY
from tests.catalogue_fixtures import with_tools
from tests.metrics_fixtures import (
    DASHBOARD,
    ROOT,
    RULES,
    parse,
    used_metrics,
    value,
)

pytestmark = pytest.mark.django_db

TOKEN = "a-scrape-token-of-some-length"


@pytest.fixture
def token(settings):
    settings.TASKHUB_METRICS_TOKEN = TOKEN
    settings.TASKHUB_METRICS_ALLOWED_NETWORKS = []
    return TOKEN


def scrape(client) -> dict[str, dict[tuple, float]]:
    """{sample name: {sorted label items: value}} of one authorised scrape."""
    response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return parse(response.content.decode())


def make_server(name: str = "alpha", **fields) -> Server:
    return Server.objects.create(name=name, transport=Transport.HTTP, url=f"http://127.0.0.1:9/{name}", **fields)


# --- who may read it ---------------------------------------------------------------------------------------------


def test_without_a_token_or_networks_configured_nobody_reads_the_metrics(client, settings):
    settings.TASKHUB_METRICS_TOKEN = ""
    settings.TASKHUB_METRICS_ALLOWED_NETWORKS = []
    response = client.get("/metrics", headers={"Authorization": "Bearer "})
    assert response.status_code == 403 and b"TASKHUB_METRICS_TOKEN" in response.content


def test_the_bearer_token_is_required_and_checked(client, token):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {token}"}):
        response = client.get("/metrics", headers=headers)
        assert response.status_code == 401, headers
        assert response["WWW-Authenticate"].startswith("Bearer")
        assert b"taskhub_" not in response.content
    assert client.get("/metrics", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    assert client.post("/metrics", headers={"Authorization": f"Bearer {token}"}).status_code == 405


def test_allowed_networks_alone_or_with_the_token(client, settings):
    settings.TASKHUB_METRICS_TOKEN = ""
    settings.TASKHUB_METRICS_ALLOWED_NETWORKS = ["10.0.0.0/8", "::1"]
    assert client.get("/metrics").status_code == 403  # the test client comes from 127.0.0.1
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="::ffff:10.1.2.3").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="::1").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="not an address").status_code == 403
    settings.TASKHUB_METRICS_TOKEN = TOKEN  # both set: both are required
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 401
    assert (
        client.get("/metrics", REMOTE_ADDR="11.1.2.3", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 403
    )
    assert (
        client.get("/metrics", REMOTE_ADDR="10.1.2.3", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    )


# --- figures from Postgres -----------------------------------------------------------------------------------------


def counted_by_sql() -> dict[tuple[str, str], float]:
    rows = Task.objects.values_list("server_id", "status").annotate(n=Count("id"))
    return {(str(server), status): float(n) for server, status, n in rows}


def delta_rows() -> list[tuple[str, str, float]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT server_id, status, delta FROM observability_taskstatusdelta")
        return sorted((str(server), status, float(delta)) for server, status, delta in cursor.fetchall())


def test_the_fold_runs_every_five_minutes_in_the_worker():
    from procrastinate.contrib.django import app

    app.perform_import_paths()
    periodic = {task.task.name: task.cron for task in app.periodic_registry.periodic_tasks.values()}
    assert periodic["taskhub.fold_task_counts"] == "*/5 * * * *"


def exposed_task_counts(families) -> dict[tuple[str, str], float]:
    return {
        (dict(key)["server"], dict(key)["status"]): count for key, count in families.get("taskhub_tasks", {}).items()
    }


@pytest.mark.embedded
def test_tasks_by_server_and_status_follow_every_write_and_survive_folding(client, token, monkeypatch):
    alpha, beta = make_server("alpha"), make_server("beta")
    Task.objects.bulk_create(
        [Task(server=alpha, tool="t", status=TaskStatus.WORKING) for _ in range(5)]
        + [Task(server=beta, tool="t", status=TaskStatus.INPUT_REQUIRED) for _ in range(3)]
    )
    one = Task.objects.create(server=beta, tool="t")
    assert (
        exposed_task_counts(scrape(client))
        == counted_by_sql()
        == {
            (str(alpha.pk), "working"): 5,
            (str(beta.pk), "input_required"): 3,
            (str(beta.pk), "launching"): 1,
        }
    )
    # Updates that change the status (one statement, several rows; a save), one that does not, and deletes.
    two_working = Task.objects.filter(server=alpha).values_list("pk", flat=True)[:2]
    Task.objects.filter(pk__in=list(two_working)).update(status=TaskStatus.COMPLETED)
    one.status = TaskStatus.WORKING
    one.save()
    Task.objects.filter(server=beta, status=TaskStatus.INPUT_REQUIRED).update(status_message="still asking")
    Task.objects.filter(pk__in=list(Task.objects.filter(server=beta).values_list("pk", flat=True)[:2])).delete()
    expected = counted_by_sql()
    assert exposed_task_counts(scrape(client)) == expected
    assert sum(expected.values()) == 7

    # Once there are more rows than FOLD_ROWS, a scrape folds them into one per (server, status) with a count.
    assert len(delta_rows()) > len(expected)
    monkeypatch.setattr(counts, "FOLD_ROWS", 2)
    assert exposed_task_counts(scrape(client)) == expected
    assert delta_rows() == sorted((*key, count) for key, count in expected.items())
    assert exposed_task_counts(scrape(client)) == expected
    # The periodic job's fold, after more changes.
    Task.objects.filter(server=alpha).update(status=TaskStatus.FAILED)
    Task.objects.create(server=alpha, tool="t")
    expected = counted_by_sql()
    assert counts.fold() is True
    assert delta_rows() == sorted((*key, count) for key, count in expected.items())
    assert exposed_task_counts(scrape(client)) == expected
    Task.objects.all().delete()
    assert exposed_task_counts(scrape(client)) == {}


@pytest.mark.django_db(transaction=True)
def test_a_page_reads_the_kept_counts_in_one_statement_and_folds_them_when_due(monkeypatch):
    alpha = make_server("alpha")
    for status in (TaskStatus.WORKING, TaskStatus.WORKING, TaskStatus.LAUNCHING):
        Task.objects.create(server=alpha, tool="t", status=status)
    with CaptureQueriesContext(connection) as read:
        assert counts.tasks_per_status() == {"working": 2, "launching": 1}
    # No BEGIN and COMMIT around it: the nav and the list's tabs read these on every page and live change.
    assert [query["sql"] for query in read.captured_queries] == [counts.sum_sql(*counts.TASKS)]
    assert len(delta_rows()) == 3

    monkeypatch.setattr(counts, "FOLD_ROWS", 2)
    assert counts.tasks_per_status() == {"working": 2, "launching": 1}
    assert delta_rows() == [(str(alpha.pk), "launching", 1.0), (str(alpha.pk), "working", 2.0)]
    assert counts.tasks_per_status(server_ids={alpha.pk + 1}) == {}


def test_the_inbox_the_queue_the_leases_and_server_health(client, token, empty_job_queue):
    # The database's clock, which the metrics read (now(): the start of this test's transaction, a little before
    # timezone.now(); an age measured from timezone.now() came out a few ms short of 30 minutes).
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        now = cursor.fetchone()[0]
    alpha = with_tools(make_server("alpha", last_success_at=now), "approval")
    down = make_server("down", unreachable_since=now - datetime.timedelta(minutes=11))
    make_server("off", enabled=False)
    task = services.launch(server=alpha, tool="approval", arguments={}, user=None)  # defers a launch job
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.INPUT_REQUIRED, remote_task_id="r1")
    waiting = Task.objects.create(server=down, tool="t", status=TaskStatus.WORKING, remote_task_id="r2")
    TaskPoll.objects.create(
        task=task, next_poll_at=now, lease_owner="w1", lease_expires_at=now + datetime.timedelta(minutes=1)
    )
    TaskPoll.objects.create(
        task=waiting,
        next_poll_at=now,
        lease_owner="w2",
        lease_expires_at=now - datetime.timedelta(minutes=1),
        consecutive_failures=4,
    )
    InputRequest.objects.create(task=task, key="a", method="elicitation/create")
    old = InputRequest.objects.create(task=task, key="b", method="elicitation/create")
    InputRequest.objects.filter(pk=old.pk).update(created_at=now - datetime.timedelta(minutes=30))
    InputRequest.objects.create(
        task=waiting,
        key="c",
        method="elicitation/create",
        state=InputRequestState.ANSWERED,
        answered_at=now - datetime.timedelta(minutes=12),
        answer={"action": "decline"},
    )
    InputRequest.objects.create(task=waiting, key="d", method="elicitation/create", state=InputRequestState.DELIVERED)

    families = scrape(client)
    a, d = str(alpha.pk), str(down.pk)
    assert value(families, "taskhub_input_requests_open", server=a) == 2
    assert value(families, "taskhub_input_requests_open", server=d) == 0
    assert value(families, "taskhub_answers_undelivered", server=d) == 1
    assert value(families, "taskhub_answers_undelivered", server=a) == 0
    assert 30 * 60 <= value(families, "taskhub_input_request_oldest_age_seconds", state="open") < 40 * 60
    assert 12 * 60 <= value(families, "taskhub_input_request_oldest_age_seconds", state="answered") < 20 * 60
    assert value(families, "taskhub_jobs", kind="launch", status="todo") == 1
    assert value(families, "taskhub_jobs", kind="cancel", status="todo") == 0
    assert 0 <= value(families, "taskhub_job_oldest_wait_seconds", kind="launch") < 60
    assert families["taskhub_tracker_leases_held"] == {(("worker", "w1"),): 1}
    assert value(families, "taskhub_server_info", server=a, name="alpha", transport="http") == 1
    assert value(families, "taskhub_server_reachable", server=a) == 1
    assert value(families, "taskhub_server_reachable", server=d) == 0
    assert 11 * 60 <= value(families, "taskhub_server_unreachable_seconds", server=d) < 20 * 60
    assert value(families, "taskhub_server_last_success_timestamp_seconds", server=a) == pytest.approx(
        now.timestamp(), abs=1
    )
    assert value(families, "taskhub_server_last_success_timestamp_seconds", server=d) is None
    assert value(families, "taskhub_server_consecutive_failures", server=d) == 4
    assert value(families, "taskhub_server_consecutive_failures", server=a) == 0
    assert not any("off" in str(key) for key in families["taskhub_server_info"])  # a disabled server is left out
    assert value(families, "taskhub_metrics_database_read_seconds") > 0


def labelled(families, name: str, label: str) -> dict[str, float]:
    return {dict(key)[label]: count for key, count in families.get(name, {}).items()}


def sql_rows(sql: str) -> dict:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return {str(row[0]): row[1] for row in cursor.fetchall()}


def expected_requests(state: str, servers) -> dict[str, int]:
    counted = sql_rows(f"SELECT server_id, count(*) FROM tasks_inputrequest WHERE state = '{state}' GROUP BY 1")
    return {str(server.pk): counted.get(str(server.pk), 0) for server in servers}


def expected_failures(servers) -> dict[str, int]:
    most = sql_rows(
        "SELECT task.server_id, max(poll.consecutive_failures) FROM tasks_taskpoll AS poll"
        " JOIN tasks_task AS task ON task.id = poll.task_id GROUP BY 1"
    )
    return {str(server.pk): most.get(str(server.pk), 0) for server in servers}


def expected_leases(alive: set[str]) -> dict[str, int]:
    """Rows naming each owner whose heartbeat is live; an owner without a heartbeat row: its unexpired leases."""
    named = sql_rows("SELECT lease_owner, count(*) FROM tasks_taskpoll WHERE lease_owner <> '' GROUP BY 1")
    unexpired = sql_rows(
        "SELECT lease_owner, count(*) FROM tasks_taskpoll WHERE lease_owner <> '' AND lease_expires_at > now()"
        " AND lease_owner NOT IN (SELECT owner FROM worker_heartbeat) GROUP BY 1"
    )
    return {**{owner: count for owner, count in named.items() if owner in alive}, **unexpired}


def inbox_leases_failures_exposed(families) -> tuple:
    return (
        labelled(families, "taskhub_input_requests_open", "server"),
        labelled(families, "taskhub_answers_undelivered", "server"),
        labelled(families, "taskhub_tracker_leases_held", "worker"),
        labelled(families, "taskhub_server_consecutive_failures", "server"),
    )


def inbox_leases_failures_by_sql(servers, alive) -> tuple:
    return (
        expected_requests("open", servers),
        expected_requests("answered", servers),
        expected_leases(alive),
        expected_failures(servers),
    )


@pytest.mark.embedded
def test_requests_leases_and_failures_follow_every_write_and_survive_folding(client, token, monkeypatch):
    from taskhub.worker.models import WorkerHeartbeat
    from taskhub.worker.tracker.leases import RELEASE_SQL

    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        now = cursor.fetchone()[0]
    minute = datetime.timedelta(minutes=1)
    alpha, beta = make_server("alpha"), make_server("beta")
    servers = [alpha, beta]
    tasks = Task.objects.bulk_create(
        [Task(server=servers[n % 2], tool="t", status=TaskStatus.INPUT_REQUIRED) for n in range(8)]
    )
    InputRequest.objects.bulk_create(
        [InputRequest(task=t, server=t.server, key=f"k{n}", method="elicitation/create") for n, t in enumerate(tasks)]
    )
    # w1 beats, w2 stopped beating an hour ago, w3 has no heartbeat row (one lease live, one expired).
    WorkerHeartbeat.objects.create(owner="w1", started_at=now, beat_at=now)
    WorkerHeartbeat.objects.create(owner="w2", started_at=now - 60 * minute, beat_at=now - 60 * minute)
    owners = ["w1", "w1", "w1", "w2", "w2", "w3", "w3", ""]
    expiries = [now + minute] * 5 + [now + minute, now - minute, None]
    failures = [0, 3, 1, 0, 2, 0, 5, 0]
    TaskPoll.objects.bulk_create(
        [
            TaskPoll(task=t, next_poll_at=now, lease_owner=o, lease_expires_at=e, consecutive_failures=f)
            for t, o, e, f in zip(tasks, owners, expiries, failures, strict=True)
        ]
    )
    alive = {"w1"}
    first = inbox_leases_failures_exposed(scrape(client))
    assert first == inbox_leases_failures_by_sql(servers, alive)
    assert first == (
        {str(alpha.pk): 4, str(beta.pk): 4},
        {str(alpha.pk): 0, str(beta.pk): 0},
        {"w1": 3, "w3": 1},
        {str(alpha.pk): 5, str(beta.pk): 3},
    )

    # Answers stored (one statement), one delivered (a save), one request gone, one asked: the inbox.
    InputRequest.objects.filter(task__in=tasks[:3]).update(state=InputRequestState.ANSWERED, answered_at=now)
    delivered = InputRequest.objects.get(task=tasks[0])
    delivered.state = InputRequestState.DELIVERED
    delivered.save()
    InputRequest.objects.filter(task=tasks[7]).delete()
    InputRequest.objects.create(task=tasks[7], key="again", method="elicitation/create")
    # The tracker: a row taken over by another owner, a worker's release, a row whose task ended, a new row held.
    TaskPoll.objects.filter(task=tasks[3]).update(lease_owner="w1", lease_expires_at=now + minute)
    with connection.cursor() as cursor:
        cursor.execute(RELEASE_SQL, {"owner": "w3"})
    TaskPoll.objects.filter(task=tasks[2]).delete()
    # Failures: one more, a recovery, a row failing that did not, a reschedule that keeps them.
    TaskPoll.objects.filter(task=tasks[4]).update(consecutive_failures=4)
    TaskPoll.objects.filter(task=tasks[6]).update(consecutive_failures=0)
    TaskPoll.objects.filter(task=tasks[0]).update(consecutive_failures=1)
    TaskPoll.objects.update(next_poll_at=now + minute, consecutive_failures=F("consecutive_failures"))
    expected = inbox_leases_failures_by_sql(servers, alive)
    assert inbox_leases_failures_exposed(scrape(client)) == expected
    assert expected == (
        {str(alpha.pk): 2, str(beta.pk): 3},
        {str(alpha.pk): 1, str(beta.pk): 1},
        {"w1": 3},
        {str(alpha.pk): 4, str(beta.pk): 3},
    )

    # Folded by a scrape (each table past FOLD_ROWS) and by the periodic job: the same counts from fewer rows.
    monkeypatch.setattr(counts, "FOLD_ROWS", 2)

    def rows_and_keys(table: str, keys: str) -> tuple[int, int]:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT count(*), count(DISTINCT ({keys})) FROM {table}")
            return cursor.fetchone()

    for table in (counts.INPUT_REQUESTS, counts.LEASES, counts.POLL_FAILURES):
        rows, keys = rows_and_keys(*table)
        assert rows > keys, table
    assert inbox_leases_failures_exposed(scrape(client)) == expected
    for table in counts.TABLES:
        rows, keys = rows_and_keys(*table)
        assert rows == keys, table
    TaskPoll.objects.filter(task=tasks[1]).delete()
    assert counts.fold() is True
    expected = inbox_leases_failures_by_sql(servers, alive)
    assert inbox_leases_failures_exposed(scrape(client)) == expected
    assert expected[3] == {str(alpha.pk): 4, str(beta.pk): 0}


@pytest.mark.embedded
def test_the_oldest_due_job_counts_from_its_deferral_or_its_schedule(client, token, empty_job_queue):
    from taskhub.tasks.hooks import CANCEL_DELIVERY_JOB

    with connection.cursor() as cursor:
        for lock, scheduled, deferred in (
            ("a", None, "2 minutes"),  # waits since it was deferred
            ("b", "5 minutes", "10 minutes"),  # a retry: waits since it was due again
            ("c", "-5 minutes", "20 minutes"),  # due in 5 minutes: not waiting yet
        ):
            cursor.execute(
                "INSERT INTO procrastinate_jobs (queue_name, task_name, lock, args, status, scheduled_at)"
                " VALUES ('default', %s, %s, '{}', 'todo', now() - %s::interval) RETURNING id",
                [CANCEL_DELIVERY_JOB, lock, scheduled],
            )
            job_id = cursor.fetchone()[0]
            cursor.execute(
                "UPDATE procrastinate_events SET at = now() - %s::interval WHERE job_id = %s AND type = 'deferred'",
                [deferred, job_id],
            )
    families = scrape(client)
    assert value(families, "taskhub_jobs", kind="cancel", status="todo") == 3
    assert 5 * 60 <= value(families, "taskhub_job_oldest_wait_seconds", kind="cancel") < 6 * 60
    assert value(families, "taskhub_job_oldest_wait_seconds", kind="launch") == 0


def test_requests_are_counted_by_view_and_status_never_by_path(client, token):
    before = scrape(client)
    client.get("/healthz")
    client.get("/no/such/page/4242")
    after = scrape(client)

    def grew(**labels) -> float:
        name = "taskhub_http_requests_total"
        return (value(after, name, **labels) or 0) - (value(before, name, **labels) or 0)

    assert grew(method="GET", view="web:healthz", status="200") == 1, after["taskhub_http_requests_total"]
    assert grew(method="GET", view="<unmatched>", status="404") == 1
    # Another test in this process may have counted a status such as 429, so look for the path's own parts.
    label_values = {label_value for key in after["taskhub_http_requests_total"] for _, label_value in key}
    assert not any("no/such" in label or "4242" in label for label in label_values), label_values
    assert value(after, "taskhub_db_queries_total", alias="default") > value(
        before, "taskhub_db_queries_total", alias="default"
    )


# --- the dashboard and the alert rules -------------------------------------------------------------------------


def exposed_families(text: str) -> set[str]:
    """Every family /metrics declares (# TYPE lines): a labelled metric with no sample yet is declared too."""
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def test_the_dashboard_is_a_grafana_dashboard_of_prometheus_panels():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] == "taskhub" and dashboard["uid"] and isinstance(dashboard["schemaVersion"], int)
    assert [variable["name"] for variable in dashboard["templating"]["list"]] == ["DS_PROMETHEUS"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    graphs = [panel for panel in dashboard["panels"] if panel["type"] != "row"]
    assert len(graphs) >= 15
    for panel in graphs:
        assert panel["type"] in {"timeseries", "stat", "table", "gauge"}, panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}"
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert re.fullmatch(r"[A-Z]", target["refId"]) and target["expr"].count("(") == target["expr"].count(")")


def test_the_alert_rules_cover_the_three_alerts_of_the_issue():
    rules = {rule["alert"]: rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}
    assert 'taskhub_input_request_oldest_age_seconds{state="answered"}' in rules["TaskhubAnswersWaiting"]["expr"]
    assert "histogram_quantile(0.99" in rules["TaskhubPollLatenessHigh"]["expr"]
    assert rules["TaskhubPollLatenessHigh"]["expr"].endswith("> 5")
    assert rules["TaskhubServerUnreachable"]["for"] == "10m"
    for rule in rules.values():
        assert re.fullmatch(r"\d+[smh]", rule["for"]) and rule["labels"]["severity"] and rule["annotations"]["summary"]
        assert rule["expr"].count("(") == rule["expr"].count(")")


def test_every_expression_uses_metrics_that_metrics_exposes(client, token):
    response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    exposed = exposed_families(response.content.decode())
    used = used_metrics()
    assert len(used) >= 20
    assert used <= exposed, sorted(used - exposed)


# --- job attempts ----------------------------------------------------------------------------------------------


def attempts(kind: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("taskhub_job_attempts_total", {"kind": kind, "outcome": outcome}) or 0.0


@pytest.mark.parametrize(
    ("raised", "attempts_before", "outcome"),
    [
        (None, 0, "succeeded"),
        (TransportError("unreachable"), 0, "retried"),  # DELIVERY_RETRY retries it
        (TransportError("unreachable"), DELIVERY_RETRY.max_attempts, "failed"),  # its last attempt
        (ValueError("a bug"), 0, "failed"),  # not a retried exception
    ],
)
def test_each_job_run_is_counted_by_kind_and_outcome(raised, attempts_before, outcome):
    from procrastinate.contrib.django import app

    job = Job(queue="default", lock=None, queueing_lock=None, task_name=ANSWER_DELIVERY_JOB, attempts=attempts_before)
    context = JobContext(app=app, job=job, start_timestamp=time.time(), abort_reason=lambda: None)

    async def run():
        if raised is not None:
            raise raised
        return "delivered"

    before = attempts("answer_delivery", outcome)
    if raised is None:
        assert asyncio.run(count_job(run, context, None)) == "delivered"
    else:
        with pytest.raises(type(raised)):
            asyncio.run(count_job(run, context, None))
    assert attempts("answer_delivery", outcome) == before + 1


def test_a_database_that_cannot_be_read_still_leaves_the_process_metrics(client, token, monkeypatch):
    client.get("/healthz")
    monkeypatch.setattr(collectors, "SERVERS_SQL", "SELECT * FROM no_such_table")
    samples = scrape(client)
    assert value(samples, "taskhub_metrics_database_up") == 0
    assert "taskhub_tasks" not in samples
    assert value(samples, "taskhub_http_requests_total", method="GET", view="web:healthz", status="200") >= 1
    monkeypatch.undo()
    assert value(scrape(client), "taskhub_metrics_database_up") == 1


def test_a_malformed_allowed_network_stops_the_settings():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "taskhub.settings", "DEBUG": "true"}
    code = "from django.conf import settings; settings._setup()"
    for networks, fails in (("10.0.0.0/8, 192.168.1.7", False), ("10.0.0.0/33", True), ("localhost", True)):
        env["TASKHUB_METRICS_ALLOWED_NETWORKS"] = networks
        run = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True)
        assert (run.returncode != 0) is fails, run.stderr
        assert ("ImproperlyConfigured: TASKHUB_METRICS_ALLOWED_NETWORKS" in run.stderr) is fails, run.stderr


def test_the_demo_opens_metrics_to_its_own_machine_and_a_deployment_stays_closed(client, settings):
    """Issue 34, item 9: `taskhub demo` serves /metrics to its own machine without a restart or a variable (the
    README's demo user can look at once), keeps whatever the variables say when set, and nothing else changes:
    without them, a deployment refuses /metrics to everyone (test_without_a_token_or_networks_…)."""
    from taskhub.cli import demo_metrics_access

    demo: dict[str, str] = {}
    assert demo_metrics_access(demo).startswith("from this machine only")
    settings.TASKHUB_METRICS_TOKEN = ""
    settings.TASKHUB_METRICS_ALLOWED_NETWORKS = demo["TASKHUB_METRICS_ALLOWED_NETWORKS"].split(",")
    assert client.get("/metrics").status_code == 200  # the test client comes from 127.0.0.1
    assert client.get("/metrics", REMOTE_ADDR="::1").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="192.168.1.20").status_code == 403

    told = {"TASKHUB_METRICS_TOKEN": "a-token-of-the-operators-own"}
    assert demo_metrics_access(told).startswith("as TASKHUB_METRICS_TOKEN") and "ALLOWED" not in str(told)
