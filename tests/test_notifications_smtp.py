"""A digest through a real SMTP server on 127.0.0.1 (aiosmtpd), sent by the worker's job in a real procrastinate
worker: first while nobody listens (the job fails, is retried, the events stay unsent), then once the server is up;
and to a server that refuses one address for good (550: given up at once) and another for now (451: retried, up to
a cap)."""

import datetime
import email
import email.policy
import logging

import pytest
from aiosmtpd.controller import Controller
from asgiref.sync import async_to_sync
from django.utils import timezone
from procrastinate.contrib.django.models import ProcrastinateJob

from taskhub.accounts.groups import APPROVERS, OPERATORS
from taskhub.approvals.models import MailEvent
from taskhub.approvals.notifications import digest
from taskhub.approvals.notifications.outbox import MAIL_DIGEST_JOB, users_with_unsent_events
from taskhub.audit.models import AuditEvent
from taskhub.mcp.client import TaskCreated
from taskhub.servers.services import create_server
from taskhub.tasks import services
from tests.account_fixtures import make_user
from tests.catalogue_fixtures import with_tools
from tests.helpers import free_port, snapshot
from tests.stack_fixtures import run_worker_until_idle

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_job_queue")]


class Inbox:
    """aiosmtpd's handler: keeps every message it is given."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, list[str], email.message.EmailMessage]] = []

    async def handle_DATA(self, server, session, envelope) -> str:
        parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
        self.messages.append((envelope.mail_from, list(envelope.rcpt_tos), parsed))
        return "250 Message accepted for delivery"


class RefusingInbox(Inbox):
    """Refuses the given addresses at RCPT TO with the given reply."""

    def __init__(self, refusals: dict[str, str]) -> None:
        super().__init__()
        self.refusals = refusals

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options) -> str:
        if address in self.refusals:
            return self.refusals[address]
        envelope.rcpt_tos.append(address)
        return "250 OK"


@pytest.fixture
def smtp_settings(settings):
    port = free_port()
    settings.MAILERS = {
        "default": {
            "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "OPTIONS": {"host": "127.0.0.1", "port": port, "timeout": 10},
        }
    }
    settings.DEFAULT_FROM_EMAIL = "taskhub <hub@example.com>"
    settings.TASKHUB_BASE_URL = "https://hub.example"
    settings.TASKHUB_MAIL_DIGEST_SECONDS = 0  # no window: the digest is due at once
    return port


def test_the_workers_job_mails_one_digest_through_smtp_and_retries_while_the_server_is_down(smtp_settings):
    port = smtp_settings

    alpha = with_tools(create_server(name="alpha", transport="http", url="http://alpha.example/mcp", user=None), "x")
    make_user("ada", APPROVERS, email="ada@example.com")
    olga = make_user("olga", OPERATORS)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    for number in range(3):  # three tasks, each committed on its own: three signals, one digest
        task = services.launch(server=alpha, tool="x", arguments={}, user=olga)
        task = services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot(task_id=f"r-{number}")))
        ask = {"method": "elicitation/create", "params": {"message": f"Approve <{number}>?", "requestedSchema": schema}}
        services.apply_snapshot(
            task=task, snapshot=snapshot("input_required", task_id=f"r-{number}", inputRequests={"q": ask})
        )
    assert MailEvent.objects.filter(user__username="ada", sent_at__isnull=True).count() == 3
    assert ProcrastinateJob.objects.filter(task_name=MAIL_DIGEST_JOB).count() == 1

    # Nobody listens on the port: the job fails, procrastinate schedules its retry, the worker carries on.
    async_to_sync(run_worker_until_idle)(timeout=60, concurrency=2)
    job = ProcrastinateJob.objects.get(task_name=MAIL_DIGEST_JOB)
    assert (job.status, job.attempts) == ("todo", 1)
    events = MailEvent.objects.filter(user__username="ada", sent_at__isnull=True)
    assert events.count() == 3 and "ConnectionRefusedError" in events.first().last_error

    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        ProcrastinateJob.objects.filter(pk=job.pk).update(scheduled_at=timezone.now())  # its retry, now
        async_to_sync(run_worker_until_idle)(timeout=60, concurrency=2)
    finally:
        controller.stop()

    assert len(inbox.messages) == 1
    sender, recipients, message = inbox.messages[0]
    assert (sender, recipients) == ("hub@example.com", ["ada@example.com"])
    assert message["Subject"] == "taskhub: 3 requests wait for you"
    text = message.get_body(("plain",)).get_content()
    html = message.get_body(("html",)).get_content()
    assert "server says: Approve <0>?" in text and "https://hub.example/tasks/" in text
    assert "Approve &lt;2&gt;?" in html and "Approve <2>?" not in html
    assert ProcrastinateJob.objects.get(pk=job.pk).status == "succeeded"
    assert not MailEvent.objects.filter(sent_at__isnull=True).exists()
    assert AuditEvent.objects.filter(action="notification.mail_sent", data__to="ada").count() == 1


def test_an_address_refused_for_good_is_given_up_at_once_and_one_refused_for_now_is_retried_up_to_a_cap(
    smtp_settings, caplog
):
    inbox = RefusingInbox(
        {
            "gone@example.com": "550 5.1.1 <gone@example.com>: no such user",
            "busy@example.com": "451 4.3.0 try again later",
        }
    )
    controller = Controller(inbox, hostname="127.0.0.1", port=smtp_settings)
    controller.start()
    try:
        alpha = with_tools(
            create_server(name="alpha", transport="http", url="http://alpha.example/mcp", user=None), "x"
        )
        for name, address in (("ada", "ada@example.com"), ("bob", "gone@example.com"), ("cy", "busy@example.com")):
            make_user(name, APPROVERS, email=address)
        olga = make_user("olga", OPERATORS)
        task = services.launch(server=alpha, tool="x", arguments={}, user=olga)
        task = services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot(task_id="r-1")))
        ask = {"method": "elicitation/create", "params": {"message": "Ship?", "requestedSchema": {"type": "object"}}}
        services.apply_snapshot(task=task, snapshot=snapshot("input_required", task_id="r-1", inputRequests={"q": ask}))
        assert ProcrastinateJob.objects.filter(task_name=MAIL_DIGEST_JOB).count() == 3

        with caplog.at_level(logging.WARNING, logger=digest.__name__):
            async_to_sync(run_worker_until_idle)(timeout=60, concurrency=2)

        def job_of(username: str) -> ProcrastinateJob:
            user_id = MailEvent.objects.filter(user__username=username).values_list("user_id", flat=True)[0]
            return ProcrastinateJob.objects.get(task_name=MAIL_DIGEST_JOB, args__user_id=user_id)

        assert [recipients for _, recipients, _ in inbox.messages] == [["ada@example.com"]]
        # 550: the job ends, the event is given up with the server's reply, logged once and audited.
        assert job_of("bob").status == "succeeded"
        bob_event = MailEvent.objects.get(user__username="bob")
        assert bob_event.sent_at is None and bob_event.gave_up_at is not None and bob_event.failures == 1
        assert bob_event.last_error.startswith("refused by the mail server: 550 5.1.1")
        given_up = [record for record in caplog.records if "gave up" in record.getMessage()]
        assert len(given_up) == 1 and "550 5.1.1" in given_up[0].getMessage()
        audited = AuditEvent.objects.get(action="notification.mail_given_up")
        assert audited.data["to"] == "bob" and audited.data["events"] == 1
        # 451: retried (the job waits for its next try), the event still waits.
        cy_event = MailEvent.objects.get(user__username="cy")
        assert job_of("cy").status == "todo" and cy_event.gave_up_at is None and cy_event.failures >= 1
        assert "451" in cy_event.last_error
        far_later = timezone.now() + datetime.timedelta(days=1)
        assert set(users_with_unsent_events(older_than=far_later)) == {cy_event.user_id}  # the sweep skips bob

        # The last try allowed refused for now too: given up as well, and the job ends.
        MailEvent.objects.filter(pk=cy_event.pk).update(failures=digest.FAILURES_AT_MOST - 1)
        ProcrastinateJob.objects.filter(pk=job_of("cy").pk).update(scheduled_at=timezone.now())
        async_to_sync(run_worker_until_idle)(timeout=60, concurrency=2)
    finally:
        controller.stop()
    cy_event.refresh_from_db()
    assert job_of("cy").status == "succeeded"
    assert cy_event.gave_up_at is not None and cy_event.failures == digest.FAILURES_AT_MOST
    assert cy_event.last_error.startswith(f"{digest.FAILURES_AT_MOST} tries failed, the last: SMTPRecipientsRefused")
    assert "451" in cy_event.last_error
    assert not users_with_unsent_events(older_than=far_later)
    assert len(inbox.messages) == 1
