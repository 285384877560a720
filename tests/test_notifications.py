"""Mail notifications (taskhub/approvals/notifications/): who is told, the digest through Django's locmem outbox, a
mail server that fails, the preferences page. The real SMTP server and the worker: test_notifications_smtp.py."""

import datetime
import re

import pytest
from django.core import mail
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from procrastinate.contrib.django.models import ProcrastinateJob

from taskhub.accounts import permissions
from taskhub.accounts.groups import APPROVERS, OPERATORS
from taskhub.approvals import deadlines
from taskhub.approvals import signals as approval_signals
from taskhub.approvals.models import MailEvent, NotificationKind, NotificationPreferences
from taskhub.approvals.notifications import digest, outbox
from taskhub.approvals.services import create_policy, update_policy
from taskhub.audit.models import AuditEvent
from taskhub.mcp.client import TaskCreated, ToolCompleted
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import InputRequest
from tests.account_fixtures import make_user
from tests.catalogue_fixtures import with_tools
from tests.helpers import free_port, snapshot

pytestmark = pytest.mark.django_db

BASE = "https://hub.example"
LOCMEM = {"default": {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"}}
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}}


def ask(message: str) -> dict:
    return {"method": "elicitation/create", "params": {"message": message, "requestedSchema": SCHEMA}}


@pytest.fixture(autouse=True)
def mail_settings(settings):
    settings.MAILERS = LOCMEM
    settings.TASKHUB_BASE_URL = BASE
    settings.TASKHUB_MAIL_DIGEST_SECONDS = 60


@pytest.fixture
def on_commit(django_capture_on_commit_callbacks):
    """Run what the services announce after commit (the test's transaction never commits)."""

    def run():
        return django_capture_on_commit_callbacks(execute=True)

    return run


@pytest.fixture
def alpha():
    server = create_server(name="alpha", transport="http", url="http://alpha.example/mcp", user=None)
    return with_tools(server, "deploy")


@pytest.fixture
def people(alpha):
    """The policy of alpha names the group team-alpha and refuses self-approval (the default)."""
    olga = make_user("olga", OPERATORS, APPROVERS, "team-alpha", email="olga@example.com")
    team = {
        "ada": make_user("ada", APPROVERS, "team-alpha", email="ada@example.com"),
        "bob": make_user("bob", APPROVERS, "team-alpha", email="bob@example.com"),
        "dan": make_user("dan", APPROVERS, "team-alpha"),  # no address
        "eve": make_user("eve", APPROVERS, "team-alpha", email="eve@example.com"),  # turned requests off
        "cy": make_user("cy", APPROVERS, email="cy@example.com"),  # an approver, not of alpha
        "fay": make_user("fay", "team-alpha", email="fay@example.com"),  # in the group, but no approver
    }
    NotificationPreferences.objects.create(user=team["eve"], request_waiting=False)
    from django.contrib.auth.models import Group

    policy = create_policy(server=alpha, groups=[Group.objects.get(name="team-alpha")], user=None)
    return {"olga": olga, "policy": policy, **team}


def launched_asking(server, user, requests: dict, tool="deploy"):
    task = services.launch(server=server, tool=tool, arguments={}, user=user)
    remote = f"r-{task.id}"
    task = services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot(task_id=remote)))
    services.apply_snapshot(task=task, snapshot=snapshot("input_required", task_id=remote, inputRequests=requests))
    return task


def waiting(user) -> list[MailEvent]:
    return list(MailEvent.objects.filter(user=user, sent_at__isnull=True).order_by("pk"))


def digest_jobs() -> list[ProcrastinateJob]:
    return list(ProcrastinateJob.objects.filter(task_name=outbox.MAIL_DIGEST_JOB, status="todo").order_by("id"))


def mails_to(address: str) -> list:
    return [message for message in mail.outbox if message.to == [address]]


def test_200_requests_make_one_digest_for_each_person_who_may_answer(alpha, people, on_commit):
    before = timezone.now()
    with on_commit():
        for number in range(50):
            launched_asking(alpha, people["olga"], {f"q{n}": ask(f"Deploy build {number}.{n}?") for n in range(4)})
    assert InputRequest.objects.count() == 200

    told = set(MailEvent.objects.values_list("user__username", flat=True))
    # Not olga (she launched them; the policy refuses self-approval), not dan (no address), not eve (turned off),
    # not cy (another server's approver), not fay (named by the group, but no approver).
    assert told == {"ada", "bob"}
    assert MailEvent.objects.filter(user=people["ada"], kind=NotificationKind.REQUEST_WAITING).count() == 200
    # One waiting digest job per person, however many events: the queueing lock.
    jobs = digest_jobs()
    assert sorted(job.args["user_id"] for job in jobs) == sorted([people["ada"].pk, people["bob"].pk])
    assert all(job.scheduled_at >= before + outbox.FIRST_MAIL_AFTER for job in jobs)  # soon: a burst shares it

    for name in ("ada", "bob"):
        assert digest.send_digest(user_id=people[name].pk).startswith("mailed 200")
    assert len(mail.outbox) == 2
    message = mails_to("ada@example.com")[0]
    assert message.subject == "taskhub: 200 requests wait for you"
    first = InputRequest.objects.order_by("created_at", "pk").first()
    assert f"{BASE}/tasks/{first.task_id}/#ir-{first.pk}" in message.body
    assert "server says: Deploy build 0.0?" in message.body
    assert len(re.findall(rf"{BASE}/tasks/[0-9a-f-]+/#ir-\d+", message.body)) == digest.LINKS_PER_KIND
    assert f"and 180 more: {BASE}/inbox/" in message.body
    html, kind = message.alternatives[0]
    assert kind == "text/html" and f'href="{BASE}/inbox/">and 180 more</a>' in html
    assert waiting(people["ada"]) == [] and waiting(people["bob"]) == []
    sent = AuditEvent.objects.filter(action="notification.mail_sent", data__to="ada").get()
    assert sent.data["events"] == 200 and sent.data["kinds"] == {"request_waiting": 200}

    # Nothing more to say: no second mail. A new request waits for the end of ada's window.
    assert digest.send_digest(user_id=people["ada"].pk) == "nothing waiting"
    ProcrastinateJob.objects.all().delete()
    with on_commit():
        launched_asking(alpha, people["olga"], {"late": ask("One more?")})
    job = next(job for job in digest_jobs() if job.args["user_id"] == people["ada"].pk)
    mailed_at = outbox.last_digest_at(people["ada"].pk)
    assert job.scheduled_at >= mailed_at + datetime.timedelta(seconds=60)
    # A digest job that runs early anyway (one deferred before the last mail went) mails nothing and waits too.
    ProcrastinateJob.objects.all().delete()
    assert digest.send_digest(user_id=people["ada"].pk) == "within the window: the next digest waits for its end"
    (job,) = [job for job in digest_jobs() if job.args["user_id"] == people["ada"].pk]
    assert job.scheduled_at >= mailed_at + datetime.timedelta(seconds=60)
    assert len(mail.outbox) == 2 and len(waiting(people["ada"])) == 1


def test_self_approval_decides_whether_the_launcher_is_told(alpha, people, on_commit):
    with on_commit():
        launched_asking(alpha, people["olga"], {"q": ask("Mine?")})
    assert not MailEvent.objects.filter(user=people["olga"]).exists()

    update_policy(policy=people["policy"], user=None, allow_self_approval=True)
    with on_commit():
        launched_asking(alpha, people["olga"], {"q": ask("Mine again?")})
    assert MailEvent.objects.filter(user=people["olga"], kind=NotificationKind.REQUEST_WAITING).count() == 1


def test_without_a_policy_every_approver_with_an_address_is_told(on_commit):
    beta = with_tools(create_server(name="beta", transport="http", url="http://beta.example/mcp", user=None), "x")
    make_user("ada", APPROVERS, email="ada@example.com")
    make_user("olga", OPERATORS, email="olga@example.com")
    with on_commit():
        launched_asking(beta, None, {"q": ask("Anyone?")}, tool="x")
    assert set(MailEvent.objects.values_list("user__username", flat=True)) == {"ada"}


def test_a_task_whose_launcher_asked_for_no_mail_ends_with_one_query_of_the_outbox(
    alpha, people, django_assert_num_queries
):
    """Every task's end asks the outbox (after its commit): who launched it comes with the signal, and nobody to tell
    is one query, with no transaction of its own."""
    task = services.launch(server=alpha, tool="deploy", arguments={}, user=people["olga"])
    with django_assert_num_queries(1):
        told = outbox.record_task_finished(task_id=task.pk, status="completed", launched_by_id=people["olga"].pk)
    assert told == 0 and not MailEvent.objects.exists()
    with django_assert_num_queries(0):
        assert outbox.record_task_finished(task_id=task.pk, status="completed", launched_by_id=None) == 0


def test_a_finished_task_is_mailed_to_its_launcher_only_when_asked(alpha, people, on_commit):
    task = services.launch(server=alpha, tool="deploy", arguments={}, user=people["olga"])
    with on_commit():
        services.record_launch_outcome(task=task, outcome=ToolCompleted(result={"content": []}))
    assert not MailEvent.objects.exists()  # off by default

    NotificationPreferences.objects.create(user=people["olga"], task_finished=True)
    task = services.launch(server=alpha, tool="deploy", arguments={}, user=people["olga"])
    task = services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot(task_id="r-1")))
    with on_commit():
        services.apply_snapshot(task=task, snapshot=snapshot("failed", task_id="r-1"))
    event = MailEvent.objects.get()
    assert (event.user, event.kind, event.task_id, event.detail) == (
        people["olga"],
        NotificationKind.TASK_FINISHED,
        task.pk,
        {"status": "failed"},
    )
    digest.send_digest(user_id=people["olga"].pk)
    (message,) = mail.outbox
    assert message.subject == "taskhub: 1 task you launched finished"
    assert f"deploy on alpha · ended failed\n  {BASE}/tasks/{task.pk}/" in message.body


def test_every_way_a_task_ends_announces_it_once(alpha, on_commit):
    from taskhub.tasks import signals

    heard = []

    def listen(sender, *, task_id, status, **kwargs):
        heard.append((task_id, status))

    signals.task_finished.connect(listen)
    try:
        with on_commit():
            cancelled = services.launch(server=alpha, tool="deploy", arguments={}, user=None)
            services.request_cancel(task=cancelled, user=None)  # before it was sent
            refused = services.launch(server=alpha, tool="deploy", arguments={}, user=None)
            services.record_launch_failure(task=refused, error={"message": "no"}, sent=True)
            expired = services.launch(server=alpha, tool="deploy", arguments={}, user=None)
            expired = services.record_launch_outcome(task=expired, outcome=TaskCreated(task=snapshot(task_id="r-e")))
            services.expire(task=expired)
            services.expire(task=expired)  # already final: nothing more
    finally:
        signals.task_finished.disconnect(listen)
    assert heard == [(cancelled.id, "cancelled"), (refused.id, "failed"), (expired.id, "expired")]


def test_deadline_near_and_default_applied_reach_the_answerers(alpha, people, on_commit):
    with on_commit():
        task = launched_asking(alpha, people["olga"], {"q": ask("Ship it?")})
    request = InputRequest.objects.get(task=task)
    MailEvent.objects.all().delete()
    accepted = [{"user": people["eve"].pk, "name": "eve", "at": timezone.now().isoformat()}]  # one of two, say
    InputRequest.objects.filter(pk=request.pk).update(acceptances=accepted)
    deadline = timezone.now() + datetime.timedelta(minutes=10)
    # Another part of taskhub sends these once its transaction committed; here the test plays it.
    approval_signals.deadline_near.send_robust(
        sender=None, input_request_id=request.pk, policy_id=people["policy"].pk, deadline=deadline
    )
    approval_signals.default_applied.send_robust(
        sender=None, input_request_id=request.pk, policy_id=people["policy"].pk, outcome="declined"
    )
    approval_signals.default_applied.send_robust(  # repeated: told once
        sender=None, input_request_id=request.pk, policy_id=people["policy"].pk, outcome="declined"
    )
    kinds = sorted(MailEvent.objects.filter(user=people["ada"]).values_list("kind", flat=True))
    assert kinds == [NotificationKind.DEADLINE_NEAR, NotificationKind.DEFAULT_APPLIED]
    # eve turned off only "a request waits for me"; having accepted, she needs no reminder of the deadline.
    assert set(MailEvent.objects.values_list("user__username", flat=True)) == {"ada", "bob", "eve"}
    near = MailEvent.objects.filter(kind=NotificationKind.DEADLINE_NEAR)
    assert set(near.values_list("user__username", flat=True)) == {"ada", "bob"}

    NotificationPreferences.objects.create(user=people["bob"], default_applied=False)  # turned off since
    digest.send_digest(user_id=people["ada"].pk)
    digest.send_digest(user_id=people["bob"].pk)
    digest.send_digest(user_id=people["eve"].pk)
    ada_mail = mails_to("ada@example.com")[0]
    assert ada_mail.subject == "taskhub: 1 answer deadline is near, 1 default was applied"
    assert f"answer by {deadline.astimezone(datetime.UTC):%Y-%m-%d %H:%M} UTC" in ada_mail.body
    assert "server says: Ship it? (deploy on alpha) · taskhub declined it" in ada_mail.body
    assert mails_to("bob@example.com")[0].subject == "taskhub: 1 answer deadline is near"
    assert mails_to("eve@example.com")[0].subject == "taskhub: 1 default was applied"
    assert not MailEvent.objects.filter(sent_at__isnull=True).exists()


def test_a_failing_mail_server_keeps_the_events_for_the_next_try(alpha, people, on_commit, settings):
    with on_commit():
        launched_asking(alpha, people["olga"], {"a": ask("First?"), "b": ask("Second?")})
    smtp = {"host": "127.0.0.1", "port": free_port(), "timeout": 5}  # nobody listens there
    settings.MAILERS = {"default": {"BACKEND": "django.core.mail.backends.smtp.EmailBackend", "OPTIONS": smtp}}

    with pytest.raises(OSError):
        digest.send_digest(user_id=people["ada"].pk)
    events = waiting(people["ada"])
    assert len(events) == 2
    assert events[0].failures == 1 and "ConnectionRefusedError" in events[0].last_error
    assert not AuditEvent.objects.filter(action="notification.mail_sent").exists()

    settings.MAILERS = LOCMEM  # the server is back
    assert digest.send_digest(user_id=people["ada"].pk) == "mailed 2 event(s) to ada"
    assert mails_to("ada@example.com")[0].subject == "taskhub: 2 requests wait for you"
    assert waiting(people["ada"]) == []


def test_what_a_server_says_is_cut_to_one_line_and_escaped(alpha, people, on_commit):
    hostile = "<script>alert(1)</script>\r\nBcc: victim@example.com\x00" + "x" * 10_000
    with on_commit():
        launched_asking(alpha, people["olga"], {"q": ask(hostile)})
    digest.send_digest(user_id=people["ada"].pk)
    (message,) = mails_to("ada@example.com")
    line = next(line for line in message.body.splitlines() if "server says:" in line)
    assert "<script>alert(1)</script> Bcc: victim@example.com" in line and len(line) < 400
    assert "\r" not in message.body and "\x00" not in message.body
    html = message.alternatives[0][0]
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert message.subject == "taskhub: 1 request waits for you"


def test_the_sweep_requeues_digests_whose_job_gave_up(alpha, people, on_commit):
    with on_commit():
        launched_asking(alpha, people["olga"], {"q": ask("Anyone there?")})
    ProcrastinateJob.objects.all().delete()  # the jobs gave up (or were lost)
    assert outbox.schedule_forgotten_digests() == 0  # too recent: their digest may still be on its way
    later = timezone.now() + datetime.timedelta(minutes=5)
    assert outbox.schedule_forgotten_digests(now=later) == 2
    assert outbox.schedule_forgotten_digests(now=later) == 0  # one waiting job each is enough


# --- the preferences page -------------------------------------------------------------------------------------------


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_preferences_page_shows_the_defaults_and_saves_with_an_audit_row():
    olga = make_user("olga", OPERATORS)
    client = client_for(olga)
    page = client.get(reverse("notifications:preferences"))
    assert page.status_code == 200
    form = page.context["form"]
    assert form.initial == {
        "email": "",
        "request_waiting": True,
        "deadline_near": True,
        "default_applied": True,
        "task_finished": False,
    }
    assert b"You are not an approver" in page.content
    assert reverse("notifications:preferences").encode() in client.get(reverse("tokens:list")).content  # user menu

    saved = client.post(
        reverse("notifications:preferences"),
        {"email": "olga@example.com", "request_waiting": "on", "task_finished": "on"},
        follow=True,
    )
    assert b"Your notification choices are saved." in saved.content
    preferences = NotificationPreferences.objects.get(user=olga)
    assert (preferences.request_waiting, preferences.deadline_near, preferences.task_finished) == (True, False, True)
    olga.refresh_from_db()
    assert olga.email == "olga@example.com"
    event = AuditEvent.objects.get(action="notification.preferences_changed")
    assert event.actor == olga
    assert event.data["changed"] == {
        "email": "olga@example.com",
        "deadline_near": False,
        "default_applied": False,
        "task_finished": True,
    }


def test_a_bad_address_is_named_and_changes_nothing():
    olga = make_user("olga", OPERATORS, email="olga@example.com")
    response = client_for(olga).post(reverse("notifications:preferences"), {"email": "not an address"})
    assert response.status_code == 400
    assert b"Enter a valid email address." in response.content
    olga.refresh_from_db()
    assert olga.email == "olga@example.com"
    assert not NotificationPreferences.objects.exists()
    assert not AuditEvent.objects.filter(action="notification.preferences_changed").exists()


def test_the_preferences_page_needs_a_sign_in():
    response = Client().get(reverse("notifications:preferences"))
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_the_mail_server_is_configured_from_the_environment(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    from taskhub.settings import SMTP_BACKEND, mailers_from_env

    for name, value in {
        "EMAIL_HOST": "smtp.example.com",
        "EMAIL_PORT": "587",
        "EMAIL_HOST_USER": "hub",
        "EMAIL_HOST_PASSWORD": "secret",
        "EMAIL_USE_TLS": "true",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("EMAIL_BACKEND", raising=False)
    options = {"host": "smtp.example.com", "port": 587, "username": "hub", "password": "secret", "use_tls": True}
    assert mailers_from_env() == {
        "default": {"BACKEND": SMTP_BACKEND, "OPTIONS": {**options, "use_ssl": False, "timeout": 30.0}}
    }
    monkeypatch.setenv("EMAIL_USE_SSL", "true")
    with pytest.raises(ImproperlyConfigured, match="exclude each other"):
        mailers_from_env()
    monkeypatch.setenv("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
    assert mailers_from_env() == {"default": {"BACKEND": "django.core.mail.backends.console.EmailBackend"}}


def test_the_digest_job_is_counted_as_its_own_kind_in_the_job_metrics():
    from taskhub.observability.jobs import job_kind

    assert job_kind(outbox.MAIL_DIGEST_JOB) == "mail_digest"


def test_the_mails_about_a_request_go_to_whoever_may_answer_it_before_and_after_its_escalation(alpha, on_commit):
    """recipients.answerers and permissions.may_answer ask one query, so they agree: the policy's people while the
    request is theirs, the escalation group's approvers once it was escalated at its deadline."""
    from django.contrib.auth.models import Group

    olga = make_user("olga", OPERATORS, email="olga@example.com")  # launches; no approver
    people = [
        make_user("ada", APPROVERS, "team-alpha", email="ada@example.com"),
        make_user("bob", APPROVERS, "team-alpha", email="bob@example.com"),
        make_user("cy", APPROVERS, email="cy@example.com"),  # an approver, named by nothing
        make_user("gil", APPROVERS, "finance", email="gil@example.com"),
        make_user("hal", "finance", email="hal@example.com"),  # in the escalation group, but no approver
        make_user("ivy", APPROVERS, "finance", "team-alpha", email="ivy@example.com"),
        make_user("fay", "team-alpha", email="fay@example.com"),  # in the group, but no approver
        make_user("kim", APPROVERS, "team-alpha", "finance", email="kim@example.com", is_active=False),
        olga,
    ]
    create_policy(
        server=alpha,
        tool="deploy",
        groups=[Group.objects.get(name="team-alpha")],
        answer_within=datetime.timedelta(minutes=30),
        at_deadline="escalate",
        escalation_group=Group.objects.get(name="finance"),
        user=None,
    )
    with on_commit():
        task = launched_asking(alpha, olga, {"q": ask("Ship it?")})
    request = InputRequest.objects.select_related("task").get(task=task)

    def may_answer() -> set[str]:
        request = InputRequest.objects.select_related("task").get(task=task)
        allowed = {user.username for user in people if permissions.may_answer(user, request)}
        listed = {
            user.username
            for user in people
            if InputRequest.objects.filter(permissions.requests_user_may_answer(user), pk=request.pk).exists()
        }
        assert listed == allowed
        return allowed

    def told(kind) -> set[str]:
        return set(MailEvent.objects.filter(kind=kind).values_list("user__username", flat=True))

    assert may_answer() == {"ada", "bob", "ivy"}
    assert told(NotificationKind.REQUEST_WAITING) == may_answer()
    with on_commit():  # the deadline job, a minute before the deadline and then at it
        deadlines.check_deadline(
            input_request_id=request.pk, now=request.answer_deadline_at - datetime.timedelta(minutes=1)
        )
    assert told(NotificationKind.DEADLINE_NEAR) == may_answer()
    with on_commit():
        assert deadlines.check_deadline(input_request_id=request.pk, now=request.answer_deadline_at) == "escalated"
    assert may_answer() == {"gil", "ivy"}
    assert told(NotificationKind.DEFAULT_APPLIED) == may_answer()


def test_a_digest_leaves_out_the_requests_answered_before_it_went(alpha, people, on_commit):
    """Issue 34, item 7: a digest listed two requests as waiting that had been answered seconds before it was sent."""
    with on_commit():
        task = launched_asking(alpha, people["olga"], {"a": ask("First?"), "b": ask("Second?"), "c": ask("Third?")})
    for key in ("a", "b"):  # answered after the events were recorded, before the digest goes
        request = InputRequest.objects.select_related("task__server").get(task=task, key=key)
        services.answer_input(input_request=request, response={"action": "decline"}, user=people["bob"])

    assert digest.send_digest(user_id=people["ada"].pk).startswith("mailed 1 ")
    (message,) = mails_to("ada@example.com")
    assert message.subject == "taskhub: 1 request waits for you"
    assert "Third?" in message.body and "First?" not in message.body and "Second?" not in message.body
    assert waiting(people["ada"]) == []  # the answered ones are settled, not carried by the next digest

    # All of them answered: no mail at all.
    request = InputRequest.objects.select_related("task__server").get(task=task, key="c")
    services.answer_input(input_request=request, response={"action": "decline"}, user=people["bob"])
    assert digest.send_digest(user_id=people["bob"].pk) == "nothing to mail"
    assert mails_to("bob@example.com") == []


def test_a_digest_is_written_in_the_language_its_reader_chose(alpha, people, on_commit):
    """ada chose Chinese on her profile: her digest's subject, headings and words are Chinese, what the server asked
    is as sent; bob chose nothing, and a mail has no browser to ask: English."""
    from taskhub.accounts.models import Profile

    Profile.objects.create(user=people["ada"], language="zh-hans")
    with on_commit():
        launched_asking(alpha, people["olga"], {"q": ask("Deploy build 7?"), "r": ask("Roll back?")})
    digest.send_digest(user_id=people["ada"].pk)
    digest.send_digest(user_id=people["bob"].pk)
    chinese, english = mails_to("ada@example.com")[0], mails_to("bob@example.com")[0]
    assert chinese.subject == "taskhub: 2 个请求在等你回答"
    assert chinese.body.startswith("你好") and re.search(r"服务器消息\W+ Deploy build 7\?", chinese.body)
    assert "你的收件箱" in chinese.body and "Your inbox" not in chinese.body
    html = chinese.alternatives[0][0]
    assert '<html lang="zh-hans">' in html and "服务器消息" in html and "选择你要接收的邮件" in html
    assert english.subject == "taskhub: 2 requests wait for you"
    assert english.body.startswith("Hello bob,") and "server says: Deploy build 7?" in english.body
    assert '<html lang="en">' in english.alternatives[0][0]
