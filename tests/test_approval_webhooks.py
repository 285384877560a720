"""Outgoing webhooks of approval policies, delivered by a real procrastinate worker to a receiver on 127.0.0.1 that
checks each signature: retried after a 500, given up on a 4xx, Slack's text form, receivers that hang or answer
without end, and the receiver's side of the signature."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection, transaction
from django.test import Client
from procrastinate.contrib.django import app
from procrastinate.contrib.django.models import ProcrastinateJob

from taskhub.accounts.groups import ADMINS
from taskhub.api.tokens import create_token
from taskhub.approvals import services as policy_services
from taskhub.approvals import signals, webhooks
from taskhub.approvals.hooks import enqueue_webhook_delivery
from taskhub.approvals.models import DeliveryStatus, PolicyWebhook, WebhookDelivery, WebhookEvent
from taskhub.audit.models import AuditEvent
from taskhub.servers.services import create_server
from taskhub.tasks import services as task_services
from taskhub.tasks.models import InputRequest, Task
from taskhub.worker.connector import worker_connector
from tests.account_fixtures import make_user
from tests.catalogue_fixtures import with_tools
from tests.demo_process import DemoServer
from tests.helpers import wait_until
from tests.inbox_fixtures import task_asking
from tests.stack_fixtures import register_and_discover
from tests.webhook_receiver import Answer, WebhookReceiver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_job_queue")]

SECRET = "s3cret-for-tests"
FINAL = (DeliveryStatus.DELIVERED, DeliveryStatus.FAILED, DeliveryStatus.CANCELLED)


@pytest.fixture(autouse=True)
def quick_retries(settings):
    settings.TASKHUB_WEBHOOK_RETRY_SECONDS = 0.1
    settings.TASKHUB_WEBHOOK_ATTEMPTS = 3
    settings.TASKHUB_WEBHOOK_TIMEOUT_SECONDS = 2
    settings.TASKHUB_BASE_URL = "https://taskhub.example"


@pytest.fixture
def receiver():
    receiving = WebhookReceiver(secret=SECRET).start()
    yield receiving
    receiving.stop()


@pytest.fixture
def server():
    # Never reached: the tests' requests are made through the services, and the jobs for the server are dropped.
    return create_server(name="demo", transport="http", url="http://127.0.0.1:9/mcp", user=None)


def only_webhook_jobs() -> None:
    """Drop the server's own jobs (discovery, launch): these tests run the webhooks' alone."""
    ProcrastinateJob.objects.exclude(task_name="taskhub.deliver_webhook").delete()


def run_webhook_jobs(until, timeout: float = 30) -> None:
    """A real procrastinate worker, on its own connector as in production, until `until()` (retries are due a
    tenth of a second later, so an idle queue alone does not mean done)."""

    async def work() -> None:
        async with asyncio.timeout(timeout):
            with app.replace_connector(worker_connector()) as worker_app:
                async with worker_app.open_async():
                    while not await sync_to_async(until)():
                        await worker_app.run_worker_async(
                            wait=False, concurrency=2, install_signal_handlers=False, listen_notify=False
                        )
                        await asyncio.sleep(0.05)

    async_to_sync(work)()


def all_final() -> bool:
    return not WebhookDelivery.objects.exclude(status__in=FINAL).exists()


def gated_policy(server, **webhook):
    policy = policy_services.create_policy(server=server, tool="deploy", gate_before_call=True, user=None)
    webhooks.create_webhook(policy=policy, user=None, **webhook)
    return policy


def test_a_waiting_request_is_delivered_signed_after_a_500(server, receiver):
    receiver.answers = [Answer(500, b"try later"), Answer(200)]
    gated_policy(server, url=receiver.url, secret=SECRET)
    # The gate before the call opens a request and announces it after commit: the real path of "a request waits".
    task = task_services.launch(server=with_tools(server, "deploy"), tool="deploy", arguments={}, user=None)
    only_webhook_jobs()
    delivery = WebhookDelivery.objects.get()
    assert delivery.event == WebhookEvent.REQUEST_WAITING

    started = time.monotonic()
    run_webhook_jobs(all_final)
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.last_http_status) == ("delivered", 2, 200)
    assert time.monotonic() - started < 10

    first, second = receiver.received
    assert first.signature_ok and second.signature_ok
    assert first.headers["x-taskhub-delivery"] == second.headers["x-taskhub-delivery"] == str(delivery.pk)
    assert first.headers["x-taskhub-event"] == "request.waiting"
    assert first.headers["x-taskhub-signature"].startswith("sha256=")
    assert first.body == second.body
    body = second.json
    gate = InputRequest.objects.get(task=task)
    assert body == {
        "event": "request.waiting",
        "delivery_id": str(delivery.pk),
        "server": "demo",
        "tool": "deploy",
        "task_id": str(task.pk),
        "task_url": f"https://taskhub.example/tasks/{task.pk}/",
        "request_key": gate.key,
        "message": "Run deploy on demo?",
        "deadline": None,
        "policy_id": delivery.webhook.policy_id,
    }
    # A receiver holding another secret refuses every delivery.
    assert not webhooks.verify_signature(
        secret="another",
        timestamp=second.headers["x-taskhub-timestamp"],
        body=second.body,
        signature=second.headers["x-taskhub-signature"],
    )
    assert not AuditEvent.objects.filter(action="approval_webhook.delivery_failed").exists()


def test_a_4xx_is_given_up_at_once_and_audited_once(server, receiver):
    receiver.answers = [Answer(404, b"<b>no such hook</b>" + b"y" * 10_000)]
    gated_policy(server, url=receiver.url, secret=SECRET)
    task_services.launch(server=with_tools(server, "deploy"), tool="deploy", arguments={}, user=None)
    only_webhook_jobs()
    run_webhook_jobs(all_final)
    delivery = WebhookDelivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.last_http_status) == ("failed", 1, 404)
    assert delivery.last_error.startswith("<b>no such hook</b>")
    assert len(delivery.last_error) <= webhooks.ERROR_MAX_CHARS
    assert len(receiver.received) == 1
    failed = AuditEvent.objects.get(action="approval_webhook.delivery_failed")
    assert failed.data["http_status"] == 404 and failed.data["to"].startswith("http://127.0.0.1:")
    assert failed.task_id == delivery.input_request.task_id


def test_5xx_every_time_is_given_up_after_the_attempts(server, receiver):
    receiver.answers = [Answer(503, b"down")]
    gated_policy(server, url=receiver.url, secret=SECRET)
    task_services.launch(server=with_tools(server, "deploy"), tool="deploy", arguments={}, user=None)
    only_webhook_jobs()
    run_webhook_jobs(all_final)
    delivery = WebhookDelivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.last_http_status) == ("failed", 3, 503)
    assert len(receiver.received) == 3
    assert AuditEvent.objects.filter(action="approval_webhook.delivery_failed").count() == 1


def test_slack_form_escapes_what_the_server_wrote(server, receiver):
    policy = policy_services.create_policy(server=server, tool="deploy", user=None)
    webhooks.create_webhook(policy=policy, url=receiver.url, format="slack", user=None)
    hostile = "<!channel> & <http://evil.example|click> " + "z" * 2000
    asking = {"method": "elicitation/create", "params": {"message": hostile, "requestedSchema": {"type": "object"}}}
    task = task_asking(server, {"ask": asking})
    request = InputRequest.objects.get(task=task)
    WebhookDelivery.objects.all().delete()  # the "waits" one; this test sends the deadline's signals itself
    only_webhook_jobs()
    deadline = request.created_at
    signals.deadline_near.send(sender=None, input_request_id=request.pk, policy_id=policy.pk, deadline=deadline)
    signals.default_applied.send(sender=None, input_request_id=request.pk, policy_id=policy.pk, outcome="declined")
    run_webhook_jobs(all_final)

    assert WebhookDelivery.objects.filter(status="delivered").count() == 2
    texts = {r.headers["x-taskhub-event"]: r.json for r in receiver.received}
    near = texts["request.deadline_near"]
    assert list(near) == ["text"]
    text = near["text"]
    assert "&lt;!channel&gt; &amp; &lt;http://evil.example|click&gt;" in text
    assert "<!channel>" not in text and "<http://evil" not in text
    assert f"<https://taskhub.example/tasks/{task.pk}/|Open the task>" in text
    assert f"deadline: {deadline.isoformat()}" in text
    assert len(text) < 1000  # the message is cut
    assert "taskhub: declined" in texts["request.default_applied"]["text"]
    # No secret: nothing to sign with, and a Slack webhook needs none.
    assert all("x-taskhub-signature" not in r.headers for r in receiver.received)


def test_a_turned_off_webhook_sends_nothing(server, receiver):
    gated_policy(server, url=receiver.url, secret=SECRET)
    task_services.launch(server=with_tools(server, "deploy"), tool="deploy", arguments={}, user=None)
    only_webhook_jobs()
    webhooks.update_webhook(webhook=PolicyWebhook.objects.get(), enabled=False, user=None)
    run_webhook_jobs(all_final)
    assert WebhookDelivery.objects.get().status == "cancelled" and receiver.received == []
    # And a new event queues nothing for it.
    task_services.launch(server=server, tool="deploy", arguments={}, user=None)
    assert WebhookDelivery.objects.count() == 1


def attempt_to(url: str) -> webhooks.Attempt:
    return webhooks.Attempt(delivery_id=uuid.uuid4(), url=url, headers={}, body=b"{}")


def test_a_hanging_receiver_ends_at_the_timeout_and_is_retried():
    hanging = WebhookReceiver(answers=[Answer(200, delay=3)]).start()
    try:
        started = time.monotonic()
        outcome = async_to_sync(webhooks.post)(attempt_to(hanging.url), timeout=0.5)
        assert time.monotonic() - started < 2
        assert (outcome.http_status, outcome.retryable) == (None, True)
        assert "0.5 s" in outcome.excerpt
    finally:
        hanging.stop()


def test_a_huge_answer_is_read_a_few_kilobytes_far():
    flooding = WebhookReceiver(answers=[Answer(500, endless=True)]).start()
    try:
        started = time.monotonic()
        outcome = async_to_sync(webhooks.post)(attempt_to(flooding.url), timeout=5)
        assert time.monotonic() - started < 3
        assert (outcome.http_status, outcome.retryable) == (500, True)
        assert len(outcome.excerpt) <= webhooks.RESPONSE_MAX_BYTES
    finally:
        flooding.stop()


def test_nothing_listening_is_a_connection_error_to_retry():
    outcome = async_to_sync(webhooks.post)(attempt_to("http://127.0.0.1:9/hook"), timeout=2)
    assert (outcome.http_status, outcome.retryable) == (None, True)


def test_the_signature_verifies_only_with_the_secret_the_body_and_a_recent_timestamp():
    body, now = b'{"event":"request.waiting"}', time.time()
    timestamp = str(int(now))
    signature = webhooks.sign(secret=SECRET, timestamp=timestamp, body=body)
    assert webhooks.verify_signature(secret=SECRET, timestamp=timestamp, body=body, signature=signature)
    assert not webhooks.verify_signature(secret="wrong", timestamp=timestamp, body=body, signature=signature)
    assert not webhooks.verify_signature(secret=SECRET, timestamp=timestamp, body=body + b" ", signature=signature)
    later = str(int(now) + 1)
    assert not webhooks.verify_signature(secret=SECRET, timestamp=later, body=body, signature=signature)
    assert not webhooks.verify_signature(
        secret=SECRET, timestamp=timestamp, body=body, signature=signature, now=now + 3600
    )
    assert not webhooks.verify_signature(secret=SECRET, timestamp="soon", body=body, signature=signature)


def test_the_readmes_verifier_accepts_a_real_delivery_and_refuses_a_forged_one():
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    snippet = re.search(r"```python\n(# Verify a taskhub webhook.*?)```", readme, re.S).group(1)
    namespace: dict = {}
    exec(snippet, namespace)  # the README's own code, checked
    verify = namespace["verify"]
    body, timestamp = json.dumps({"event": "request.waiting"}).encode(), str(int(time.time()))
    headers = {
        "X-Taskhub-Timestamp": timestamp,
        "X-Taskhub-Signature": webhooks.sign(secret=SECRET, timestamp=timestamp, body=body),
    }
    assert verify(SECRET.encode(), headers, body)
    assert not verify(b"another", headers, body)
    assert not verify(SECRET.encode(), headers, body.replace(b"waiting", b"granted"))


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://127.0.0.1/hook", "http"),
        ("http://169.254.169.254/latest", "denied network"),
        ("http://metadata.google.internal/x", "metadata"),
        ("http://user:pw@127.0.0.1:8080/hook", "user or password"),
        ("not a url", "valid URL"),
    ],
)
def test_urls_are_checked_like_server_urls(server, url, why):
    policy = policy_services.create_policy(server=server, user=None)
    with pytest.raises(webhooks.WebhookInvalid, match=why):
        webhooks.create_webhook(policy=policy, url=url, secret=SECRET, user=None)
    assert not PolicyWebhook.objects.exists()


def test_a_json_webhook_needs_a_secret_and_audit_rows_never_show_it(server):
    policy = policy_services.create_policy(server=server, user=None)
    with pytest.raises(webhooks.WebhookInvalid, match="needs a secret"):
        webhooks.create_webhook(policy=policy, url="http://127.0.0.1:8080/hook", user=None)
    webhook = webhooks.create_webhook(
        policy=policy, url="https://hooks.example/services/T0/B0/path-secret", secret=SECRET, user=None
    )
    webhooks.update_webhook(webhook=webhook, secret="new-secret", user=None)
    rows = json.dumps(list(AuditEvent.objects.filter(action__startswith="approval_webhook").values_list("data")))
    assert SECRET not in rows and "new-secret" not in rows and "path-secret" not in rows
    assert '"secret": "replaced"' in rows
    with connection.cursor() as cursor:
        cursor.execute("SELECT secret FROM approvals_policywebhook")
        assert "new-secret" not in cursor.fetchone()[0]  # encrypted at rest


def test_the_worker_counts_webhook_jobs_as_their_own_kind():
    from taskhub.approvals.hooks import WEBHOOK_DELIVERY_JOB
    from taskhub.observability.jobs import job_kind

    assert job_kind(WEBHOOK_DELIVERY_JOB) == "webhook"


def test_retention_deletes_old_finished_deliveries_and_keeps_those_still_tried(server):
    import datetime

    from django.utils import timezone

    policy = policy_services.create_policy(server=server, user=None)
    webhook = webhooks.create_webhook(policy=policy, url="http://127.0.0.1:8080/hook", secret=SECRET, user=None)
    old = timezone.now() - datetime.timedelta(days=31)
    for status in ("delivered", "failed", "pending"):
        delivery = WebhookDelivery.objects.create(webhook=webhook, event="request.waiting", body={}, status=status)
        WebhookDelivery.objects.filter(pk=delivery.pk).update(created_at=old)
    WebhookDelivery.objects.create(webhook=webhook, event="request.waiting", body={}, status="delivered")
    cutoff = timezone.now() - datetime.timedelta(days=30)
    assert webhooks.purge_old_deliveries(created_before=cutoff) == 2
    assert sorted(WebhookDelivery.objects.values_list("status", flat=True)) == ["delivered", "pending"]


def test_removing_a_policy_removes_its_webhooks_and_says_so(server):
    policy = policy_services.create_policy(server=server, user=None)
    webhooks.create_webhook(policy=policy, url="http://127.0.0.1:8080/hook", secret=SECRET, user=None)
    policy_services.remove_policy(policy=policy, user=None)
    assert not PolicyWebhook.objects.exists()
    removed = AuditEvent.objects.get(action="approval_policy.removed")
    assert [(w["to"], w["secret"]) for w in removed.data["webhooks_removed"]] == [("http://127.0.0.1:8080", "set")]


@pytest.mark.parametrize(
    ("answer", "status", "attempts"),
    [
        (201, "delivered", 1),
        (204, "delivered", 1),
        (301, "failed", 1),  # redirects are not followed
        (400, "failed", 1),
        (410, "failed", 1),
        (408, "delivered", 2),  # retried, then the receiver's 200
        (429, "delivered", 2),
        (502, "delivered", 2),
    ],
)
def test_what_each_answer_means(server, answer, status, attempts):
    receiving = WebhookReceiver(answers=[Answer(answer, b""), Answer(200)]).start()
    try:
        policy = policy_services.create_policy(server=server, user=None)
        webhook = webhooks.create_webhook(policy=policy, url=receiving.url, secret=SECRET, user=None)
        delivery = WebhookDelivery.objects.create(webhook=webhook, event="request.waiting", body={"event": "x"})
        for _ in range(2):
            attempt = webhooks.start_attempt(delivery_id=delivery.pk)
            if attempt is None:
                break
            webhooks.record_attempt(delivery_id=delivery.pk, outcome=async_to_sync(webhooks.post)(attempt))
        delivery.refresh_from_db()
        assert (delivery.status, delivery.attempts) == (status, attempts)
        assert AuditEvent.objects.filter(action="approval_webhook.delivery_failed").count() == (status == "failed")
    finally:
        receiving.stop()


def test_a_webhook_urls_secret_query_values_are_stored_apart_shown_nowhere_and_sent(server, receiver):
    """Issue 31, point 8: a webhook URL is stored and shown like a server URL (its ?token=…&sig=… were in clear on the
    policy page and in the API)."""
    url = f"{receiver.url}?team=blue&token=tok-1234567&Sig=sig-7654321"
    policy = gated_policy(server, url=url, secret=SECRET)
    webhook = PolicyWebhook.objects.get(policy=policy)
    assert webhook.url == f"{receiver.url}?team=blue&token=***&Sig=***"
    assert webhook.url_secrets == {"token": ["tok-1234567"], "Sig": ["sig-7654321"]}
    with connection.cursor() as cursor:  # encrypted at rest, like a server's
        cursor.execute("SELECT url_secrets::text FROM approvals_policywebhook WHERE id = %s", [webhook.pk])
        assert "tok-1234567" not in cursor.fetchone()[0]
    # Edited with the URL as shown (*** typed back): the stored values stay.
    webhooks.update_webhook(webhook=webhook, url=webhook.url, enabled=True, user=None)
    task_services.launch(server=with_tools(server, "deploy"), tool="deploy", arguments={}, user=None)
    only_webhook_jobs()
    run_webhook_jobs(all_final)
    (received,) = receiver.received
    assert received.path.endswith("?team=blue&token=tok-1234567&Sig=sig-7654321"), received.path
    alex = make_user("alex", ADMINS)
    pages = Client()
    pages.force_login(alex)
    _, token = create_token(user=alex, name="t")
    api = Client(headers={"Authorization": f"Bearer {token}"})
    shown = [
        pages.get("/approvals/").content.decode(),
        pages.get(f"/approvals/{policy.pk}/edit/").content.decode(),
        api.get("/api/approval-policies").content.decode(),
        json.dumps(list(AuditEvent.objects.values_list("data", flat=True))),
    ]
    for where in shown:
        assert "tok-1234567" not in where and "sig-7654321" not in where
    assert "token=***&amp;Sig=***" in shown[1]  # the edit page shows the URL as stored


def test_a_receiver_that_hangs_delays_only_its_own_deliveries(server, receiver, settings):
    """Issue 31, point 4: webhook deliveries took the worker's job slots; with ~80 hanging 5 s each, another
    server's quick launches took 10.8-20.1 s. They now run on a queue and runner of their own, at most
    TASKHUB_WEBHOOK_CONCURRENCY_PER_DESTINATION to one receiver at once."""
    from taskhub.approvals.hooks import WEBHOOK_QUEUE, enqueue_webhook_delivery
    from taskhub.worker.management.commands.worker import run_jobs

    settings.TASKHUB_WEBHOOK_TIMEOUT_SECONDS = 10
    settings.TASKHUB_WEBHOOK_CONCURRENCY_PER_DESTINATION = 2
    hanging = WebhookReceiver(secret=SECRET, answers=[Answer(200, delay=4)]).start()
    try:
        policy = policy_services.create_policy(server=server, tool="deploy", user=None)
        slow = webhooks.create_webhook(policy=policy, url=hanging.url, secret=SECRET, user=None)
        quick = webhooks.create_webhook(policy=policy, url=receiver.url, secret=SECRET, user=None)
        only_webhook_jobs()
        with transaction.atomic():  # the slow receiver's six first, in the order the runner takes them
            for webhook in [slow] * 6 + [quick]:
                delivery = WebhookDelivery.objects.create(webhook=webhook, event="request.waiting", body={"n": 1})
                enqueue_webhook_delivery(delivery.pk)
        assert set(ProcrastinateJob.objects.values_list("queue_name", flat=True)) == {WEBHOOK_QUEUE}
        to_quick = WebhookDelivery.objects.get(webhook=quick)

        async def run_until_the_quick_one_is_delivered() -> int:
            stop = asyncio.Event()
            with app.replace_connector(worker_connector()) as worker_app:
                async with worker_app.open_async():
                    runner = asyncio.create_task(
                        run_jobs(
                            worker_id="webhooks-test",
                            concurrency=4,  # fewer slots than the slow receiver has deliveries
                            shutdown_timeout=1,
                            stop=stop,
                            queues=[WEBHOOK_QUEUE],
                            server_slots=False,
                        )
                    )
                    started = time.monotonic()
                    try:
                        while await WebhookDelivery.objects.filter(pk=to_quick.pk, status="pending").aexists():
                            assert time.monotonic() - started < 15, "the quick receiver's delivery never went"
                            await asyncio.sleep(0.05)
                        # Each of the hanging receiver's deliveries takes 4 s: behind them, some would be done.
                        return await WebhookDelivery.objects.filter(webhook=slow, status="delivered").acount()
                    finally:
                        stop.set()
                        await asyncio.gather(runner, return_exceptions=True)

        slow_ones_done = async_to_sync(run_until_the_quick_one_is_delivered)()
        assert slow_ones_done == 0, f"the quick receiver waited behind {slow_ones_done} of the hanging one's"
        assert WebhookDelivery.objects.get(pk=to_quick.pk).status == DeliveryStatus.DELIVERED
    finally:
        hanging.stop()


def launched_and_ended(server, user, count: int) -> float:
    """Seconds from launching `count` quick calls (a tool error the demo answers at once) until all have ended."""
    started = time.monotonic()
    tasks = [task_services.launch(server=server, tool="tool_error", arguments={}, user=user) for _ in range(count)]
    wait_until(
        lambda: Task.objects.filter(pk__in=[task.pk for task in tasks], finished_at__isnull=False).count() == count,
        timeout=60,
        what=f"the {count} quick calls to end",
    )
    return time.monotonic() - started


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_with_a_receiver_hanging_another_servers_launches_take_no_longer_than_twice_their_time(workers):
    """Issue 31, point 4's acceptance through a real worker: 60 deliveries to a receiver that hangs 5 s each leave a
    server's launches within 2x of their time without them (before, with ~80 hanging, quick launches took 10-20 s)."""
    admin = make_user("ada", ADMINS)
    hanging = WebhookReceiver(secret=SECRET, answers=[Answer(200, delay=5)]).start()
    try:
        with DemoServer("--poll-interval-ms", "200") as demo:
            server = register_and_discover(demo, admin)
            other = create_server(name="other", transport="http", url="http://127.0.0.1:9/mcp", user=None)
            policy = policy_services.create_policy(server=other, tool="deploy", user=None)
            slow = webhooks.create_webhook(policy=policy, url=hanging.url, secret=SECRET, user=None)
            workers.start("webhooks-beside-launches")
            launched_and_ended(server, admin, 4)  # the worker warmed up: its connections, the server's client
            alone = launched_and_ended(server, admin, 10)
            with transaction.atomic():
                for _ in range(60):
                    delivery = WebhookDelivery.objects.create(webhook=slow, event="request.waiting", body={"n": 1})
                    enqueue_webhook_delivery(delivery.pk)
            wait_until(lambda: len(hanging.received) >= 2, timeout=30, what="the receiver to hang on deliveries")
            beside = launched_and_ended(server, admin, 10)
            hanging_now = WebhookDelivery.objects.filter(webhook=slow, status=DeliveryStatus.PENDING).count()
    finally:
        hanging.stop()
    assert hanging_now > 40, hanging_now  # the receiver still held most of them while the launches ran
    assert beside <= 2 * alone + 0.5, (
        f"10 launches took {beside:.2f} s beside the hanging receiver, {alone:.2f} s alone"
    )
