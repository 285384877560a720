"""/metrics from a running stack (issue 19 acceptance): two daphnes and two workers on one host, in prometheus-client's
multiprocess mode (one PROMETHEUS_MULTIPROC_DIR), after an approval flow through the pages, with a hostile server
whose polls break the protocol. One scrape of one web process finds every metric, with values that count what the
other processes did too; without the token it is a 401. Every expression of the dashboard and of the alert rules
names a metric this scrape has samples of.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
import uuid

import pytest

from taskhub.accounts.groups import ADMINS, APPROVERS, OPERATORS
from taskhub.tasks.models import InputRequest, InputRequestState, Task
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.browser_fixtures import running_daphne
from tests.demo_process import DemoServer
from tests.helpers import wait_until
from tests.hostile_fixtures import followed, new_remote_id, register
from tests.hostile_server import HostileServer, Result, working
from tests.metrics_fixtures import family_of, parse, used_metrics, value
from tests.stack_fixtures import LOCAL_REDIS_URL, SignedIn, Workers, register_and_discover, worker_environment

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TOKEN = "stack-scrape-token"


def scrape(base: str, token: str | None = TOKEN) -> tuple[int, str]:
    request = urllib.request.Request(f"{base}/metrics")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def samples_of(base: str) -> dict:
    status, text = scrape(base)
    assert status == 200, text
    return parse(text)


def total(samples, sample: str, **labels) -> float:
    """The sum of the samples of `sample` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for key, v in samples.get(sample, {}).items() if wanted <= set(key))


def test_one_scrape_counts_every_process_after_an_approval(tmp_path, production_password_hashers, empty_job_queue):
    # Workers run every job in the queue: a launch job left by another test would be counted as a launch.
    admin = make_user("ada", ADMINS)
    make_user("olga", OPERATORS, APPROVERS, password=TEST_PASSWORD)
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    env = {
        "REDIS_URL": LOCAL_REDIS_URL,
        "REDIS_CHANNEL_PREFIX": f"taskhub-test-{uuid.uuid4().hex[:12]}",
        "PROMETHEUS_MULTIPROC_DIR": str(multiproc),
        "TASKHUB_METRICS_TOKEN": TOKEN,
    }
    with DemoServer("--poll-interval-ms", "200") as demo, HostileServer() as hostile:
        server = register_and_discover(demo, admin)
        bad_server = register(hostile)
        remote = new_remote_id("paused")
        hostile.script(remote, lambda n: Result(working(remote, status="paused")))
        workers = Workers(worker_environment(**env))
        try:
            workers.start("metrics-a")
            workers.start("metrics-b")
            with running_daphne(**env) as web_a, running_daphne(**env) as web_b:
                assert scrape(web_a.url, token=None)[0] == 401
                assert scrape(web_a.url, token="not-the-token")[0] == 401

                def both_workers_up() -> dict | None:
                    samples = samples_of(web_a.url)
                    up = samples.get("taskhub_process_up", {})
                    kinds = sorted(dict(key)["kind"] for key, v in up.items() if v == 1)
                    return samples if kinds == ["web", "web", "worker", "worker"] else None

                wait_until(both_workers_up, timeout=60, what="two web and two worker processes in one scrape")
                bad_task = followed(bad_server, remote)

                # The operator launches on web B; the request waits for a person.
                olga_b = SignedIn(web_b.url, "olga", TEST_PASSWORD)
                launched = olga_b.post(f"/launch/{server.pk}/approval/", {"mode": "json", "arguments_json": "{}"})
                assert launched.status == 200 and "/tasks/" in launched.url, launched.url
                task = Task.objects.get(server=server)
                request = wait_until(
                    lambda: InputRequest.objects.filter(task=task, state=InputRequestState.OPEN).first(),
                    timeout=60,
                    what="the approval request",
                )
                s = str(server.pk)

                def waiting_and_followed() -> dict | None:
                    samples = samples_of(web_a.url)
                    ready = (
                        value(samples, "taskhub_input_requests_open", server=s) == 1
                        and value(samples, "taskhub_tasks", server=s, status="input_required") == 1
                        and total(samples, "taskhub_tracker_leases_held") >= 1
                        and total(samples, "taskhub_tracker_subscriptions_open", server=s) >= 1
                        and total(samples, "taskhub_tracker_protocol_errors_total", server=str(bad_server.pk)) >= 2
                    )
                    return samples if ready else None

                waiting = wait_until(waiting_and_followed, timeout=60, what="the request and the polls in a scrape")
                assert 0 <= value(waiting, "taskhub_input_request_oldest_age_seconds", state="open") < 120

                # The approver answers on web A; a worker delivers it and the task ends.
                olga_a = SignedIn(web_a.url, "olga", TEST_PASSWORD)
                assert olga_a.post(f"/inbox/{request.pk}/answer", {"action": "decline"}).status == 200
                wait_until(lambda: Task.objects.get(pk=task.pk).is_terminal, timeout=60, what="the task to end")
                wait_until(
                    lambda: Task.objects.get(pk=bad_task.pk).poll.consecutive_failures >= 2,
                    timeout=30,
                    what="failed polls in a row",
                )

                samples = samples_of(web_b.url)
                _assert_plausible(samples, server_id=s, bad_server_id=str(bad_server.pk), server_name=server.name)
                missing = {name for name in used_metrics() if not any(family_of(sample) == name for sample in samples)}
                assert not missing, sorted(missing)
        finally:
            workers.stop_all()


def _assert_plausible(samples, *, server_id: str, bad_server_id: str, server_name: str) -> None:
    s, bad = server_id, bad_server_id
    # Requests served by each daphne (the launch on B, the answer on A) in one scrape.
    assert total(samples, "taskhub_http_requests_total", view="tasks:launch_tool", method="POST") == 1
    assert total(samples, "taskhub_http_requests_total", view="tasks:answer", method="POST") == 1
    assert total(samples, "taskhub_http_requests_total", view="accounts:login", method="POST") == 2
    assert total(samples, "taskhub_http_request_duration_seconds_count", view="tasks:answer") == 1
    assert total(samples, "taskhub_http_request_duration_seconds_bucket", view="tasks:answer", le="+Inf") == 1
    assert total(samples, "taskhub_db_queries_total") > 10
    # Postgres figures.
    assert value(samples, "taskhub_tasks", server=s, status="completed") == 1
    assert value(samples, "taskhub_tasks", server=bad, status="working") == 1
    assert value(samples, "taskhub_input_requests_open", server=s) == 0
    assert value(samples, "taskhub_input_request_oldest_age_seconds", state="open") == 0
    assert value(samples, "taskhub_input_request_oldest_age_seconds", state="answered") == 0
    assert value(samples, "taskhub_jobs", kind="launch", status="todo") == 0
    assert value(samples, "taskhub_job_oldest_wait_seconds", kind="answer_delivery") == 0
    assert value(samples, "taskhub_server_info", server=s, name=server_name, transport="http") == 1
    assert value(samples, "taskhub_server_reachable", server=s) == 1
    assert value(samples, "taskhub_server_reachable", server=bad) == 1  # it answers, wrongly
    assert value(samples, "taskhub_server_consecutive_failures", server=s) == 0
    assert value(samples, "taskhub_server_consecutive_failures", server=bad) >= 2
    assert value(samples, "taskhub_server_unreachable_seconds", server=s) == 0
    assert time.time() - 600 < value(samples, "taskhub_server_last_success_timestamp_seconds", server=s) <= time.time()
    assert 0 < value(samples, "taskhub_metrics_database_read_seconds") < 5
    # The workers' figures.
    assert total(samples, "taskhub_tracker_polls_total", server=s) >= 1
    assert total(samples, "taskhub_tracker_poll_lateness_seconds_count", server=s) >= 1
    assert total(samples, "taskhub_tracker_poll_lateness_seconds_bucket", server=s, le="+Inf") >= 1
    assert total(samples, "taskhub_tracker_poll_failures_total", server=bad, reason="protocol") >= 2
    assert total(samples, "taskhub_tracker_protocol_errors_total", server=bad, source="poll") >= 2
    assert "taskhub_tracker_subscriptions_open" in samples
    # Two launches: the approval's, and the hostile task's (its launch job finds it launched already).
    assert total(samples, "taskhub_job_attempts_total", kind="launch", outcome="succeeded") == 2
    assert total(samples, "taskhub_job_attempts_total", kind="answer_delivery", outcome="succeeded") == 1
    assert total(samples, "taskhub_job_duration_seconds_count", kind="answer_delivery") == 1
    assert total(samples, "taskhub_answer_delivery_seconds_count") == 1
    assert 0 < total(samples, "taskhub_answer_delivery_seconds_sum") < 60
    assert total(samples, "taskhub_live_pushes_total", outcome="sent") >= 3
    assert total(samples, "taskhub_live_pushes_total", outcome="dropped") == 0
