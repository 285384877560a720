"""Cancel many tasks (issue 15, item 5): the dry run, the one service call, its audit rows and jobs, who may; and the
confirm step of a single cancel. The delivery to a real server is in test_bulk_cancel_delivery.py."""

import datetime
import re

import pytest
from django.urls import reverse
from django.utils import timezone
from procrastinate.contrib.django.models import ProcrastinateJob

from taskhub.accounts.groups import OPERATORS
from taskhub.audit.models import AuditEvent
from taskhub.tasks import bulk, hooks, services
from taskhub.tasks.models import Task
from tests.account_fixtures import make_user
from tests.task_page_fixtures import durable, signed_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def oscar():
    return make_user("oscar", OPERATORS)


def confirmation(html: str) -> dict:
    """What the confirmation page offers: the count, the skipped lines, the hidden fields its form posts."""
    count = re.search(r'id="bulk-count" data-count="(\d+)" data-skipped="(\d+)"', html)
    hidden = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', html))
    hidden.pop("csrfmiddlewaretoken", None)
    skipped = re.findall(r"<li>(\d+ [^<]+)</li>", html.split('id="bulk-skipped"')[1]) if "bulk-skipped" in html else []
    return {"count": int(count[1]), "skipped_total": int(count[2]), "skipped": skipped, "form": hidden}


@pytest.fixture
def world(alpha, beta, olga, oscar):
    """On alpha: 3 working deploys by olga, 1 by oscar, 1 completed, 1 cancel already requested; on beta: 2."""
    tasks = {
        "olga": [durable(alpha, olga) for _ in range(3)],
        "oscar": [durable(alpha, oscar)],
        "done": [durable(alpha, olga, status="completed", result={"content": []})],
        "asked": [durable(alpha, olga)],
        "beta": [durable(beta, olga, tool="build") for _ in range(2)],
    }
    services.request_cancel(task=tasks["asked"][0], user=oscar)
    return tasks


def test_the_dry_run_counts_samples_and_says_what_is_skipped_and_changes_nothing(client, world, alpha, olga):
    events, jobs = AuditEvent.objects.count(), ProcrastinateJob.objects.count()
    response = signed_in(client, olga).get(reverse("tasks:cancel_many"), {"server": alpha.pk, "tool": "dep"})
    assert response.status_code == 200
    html = response.content.decode()
    seen = confirmation(html)
    assert seen["count"] == 4 and seen["skipped_total"] == 2
    assert seen["skipped"] == ["1 already finished", "1 cancel already requested"]
    assert "Cancel 4 tasks?" in html and ">Cancel 4 tasks</button>" in html
    assert seen["form"]["server"] == str(alpha.pk) and seen["form"]["tool"] == "dep" and seen["form"]["expected"] == "4"
    assert html.count('href="/tasks/') >= 4  # the sample links each task
    assert "Server</dt><dd>alpha" in html  # the choice in words
    assert AuditEvent.objects.count() == events and ProcrastinateJob.objects.count() == jobs


def test_the_filters_are_the_lists_status_launcher_and_age(client, world, olga):
    client = signed_in(client, olga)

    def dry_run(**filters) -> dict:
        return confirmation(client.get(reverse("tasks:cancel_many"), filters).content.decode())

    assert dry_run(launched_by="oscar")["count"] == 1
    assert dry_run(status="running")["count"] == 6
    completed = dry_run(status="completed")
    assert completed["count"] == 0 and completed["skipped"] == ["1 already finished"]
    assert dry_run(older="1h")["count"] == 0
    Task.objects.filter(pk=world["oscar"][0].pk).update(created_at=timezone.now() - datetime.timedelta(hours=2))
    assert dry_run(older="1h")["count"] == 1


def test_a_filter_that_does_not_fit_is_reported_and_nothing_can_be_confirmed(client, world, olga):
    client = signed_in(client, olga)
    events = AuditEvent.objects.count()
    html = client.get(reverse("tasks:cancel_many"), {"status": "nonsense", "older": "1y"}).content.decode()
    assert "There is no status “nonsense”" in html and "“Started” takes" in html
    assert 'id="bulk-count"' not in html and "<button" not in html.split('id="bulk-errors"')[1]
    response = client.post(reverse("tasks:cancel_many"), {"status": "nonsense", "before": timezone.now().isoformat()})
    assert response.status_code == 400
    response = client.post(reverse("tasks:cancel_many"), {"tool": "deploy", "before": "yesterday"})
    assert response.status_code == 400 and "missing the time of its count" in response.content.decode()
    assert AuditEvent.objects.count() == events
    assert not Task.objects.filter(cancel_requested_by=olga).exists()


def test_confirming_is_one_call_with_audit_rows_and_jobs_in_lanes(client, world, alpha, olga, settings):
    settings.TASKHUB_BULK_CANCEL_PER_SERVER = 2
    client = signed_in(client, olga)
    seen = confirmation(client.get(reverse("tasks:cancel_many"), {"server": alpha.pk}).content.decode())
    late = durable(alpha, olga)  # launched while olga read the confirmation: not hers to cancel unseen
    response = client.post(reverse("tasks:cancel_many"), seen["form"], follow=True)
    assert response.redirect_chain[-1][0] == f"{reverse('tasks:list')}?server={alpha.pk}"
    html = response.content.decode()
    assert "Cancel requested for 4 tasks (skipped: 1 already finished; 1 cancel already requested)" in html

    chosen = world["olga"] + world["oscar"]
    [action] = AuditEvent.objects.filter(action="task.bulk_cancel_requested")
    assert action.actor == olga and action.data["count"] == 4 and action.data["expected"] == 4
    assert action.data["query"] == {"server": str(alpha.pk)}
    assert action.data["skipped"] == {"already finished": 1, "cancel already requested": 1}
    rows = AuditEvent.objects.filter(action="task.cancel_requested", data__bulk_action=action.pk)
    assert sorted(rows.values_list("task_id", flat=True)) == sorted(task.pk for task in chosen)
    assert all(Task.objects.get(pk=task.pk).cancel_requested_by == olga for task in chosen)
    late.refresh_from_db()
    assert late.cancel_requested_at is None
    for task in world["done"] + world["beta"]:
        assert Task.objects.get(pk=task.pk).cancel_requested_at is None

    cancels = ProcrastinateJob.objects.filter(task_name=hooks.CANCEL_DELIVERY_JOB)
    jobs = cancels.filter(args__task_id__in=[str(t.pk) for t in chosen])
    assert jobs.count() == 4
    assert {job.priority for job in jobs} == {hooks.BULK_CANCEL_PRIORITY}
    assert sorted(job.lock for job in jobs) == sorted([f"bulk-cancel:{alpha.pk}:0", f"bulk-cancel:{alpha.pk}:1"] * 2)

    # Confirming again finds nothing left: refused with the reason, nothing written.
    events = AuditEvent.objects.count()
    response = client.post(reverse("tasks:cancel_many"), seen["form"])
    assert response.status_code == 409 and "none of the chosen tasks can be cancelled now" in response.content.decode()
    assert AuditEvent.objects.count() == events


def test_a_servers_own_job_limit_narrows_its_lanes(alpha, olga, settings):
    settings.TASKHUB_BULK_CANCEL_PER_SERVER = 4
    alpha.max_concurrent_jobs = 1
    alpha.save()
    tasks = [durable(alpha, olga) for _ in range(3)]
    done = bulk.request_cancels(
        tasks=Task.objects.filter(server=alpha), user=olga, before=timezone.now(), query={"server": str(alpha.pk)}
    )
    assert done.count == 3
    cancels = ProcrastinateJob.objects.filter(task_name=hooks.CANCEL_DELIVERY_JOB)
    locks = cancels.filter(args__task_id__in=[str(t.pk) for t in tasks]).values_list("lock", flat=True)
    assert set(locks) == {f"bulk-cancel:{alpha.pk}:0"}


def test_ticked_rows_are_the_choice(client, world, olga):
    client = signed_in(client, olga)
    ticked = [world["olga"][0], world["beta"][1], world["done"][0]]
    html = client.get(reverse("tasks:cancel_many") + "?" + "&".join(f"ids={t.pk}" for t in ticked)).content.decode()
    seen = confirmation(html)
    assert seen["count"] == 2 and seen["skipped"] == ["1 already finished"]
    assert "Ticked in the list</dt><dd>3 tasks" in html
    form = [("ids", str(t.pk)) for t in ticked] + [("before", seen["form"]["before"]), ("expected", "2")]
    client.post(reverse("tasks:cancel_many"), dict(form) | {"ids": [str(t.pk) for t in ticked]})
    assert set(Task.objects.filter(cancel_requested_by=olga).values_list("pk", flat=True)) == {
        world["olga"][0].pk,
        world["beta"][1].pk,
    }
    bad = client.get(reverse("tasks:cancel_many"), {"ids": "not-a-task"}).content.decode()
    assert "“not-a-task” is not a task id" in bad and 'id="bulk-count"' not in bad


def test_approvers_may_not_cancel_many_and_the_service_refuses_them(client, world, alpha, amy):
    assert signed_in(client, amy).get(reverse("tasks:cancel_many"), {"server": alpha.pk}).status_code == 403
    with pytest.raises(bulk.BulkRefused):
        bulk.request_cancels(tasks=Task.objects.all(), user=amy, before=timezone.now(), query={})
    assert not Task.objects.filter(cancel_requested_by=amy).exists()


def test_the_list_offers_ticks_and_cancel_matching_to_operators_only(client, world, alpha, olga, amy):
    html = signed_in(client, olga).get(reverse("tasks:list"), {"server": alpha.pk}).content.decode()
    assert 'form="bulk-pick"' in html and 'id="bulk-pick"' in html
    assert f'href="/tasks/cancel-many?server={alpha.pk}"' in html and "Cancel matching…" in html
    html = signed_in(client, amy).get(reverse("tasks:list"), {"server": alpha.pk}).content.decode()
    assert "bulk-pick" not in html and "Cancel matching" not in html


# --- a single cancel asks first ------------------------------------------------------------------------------


def test_a_single_cancel_asks_for_confirmation_first_without_js_and_with_htmx(client, alpha, olga):
    task = durable(alpha, olga)
    client = signed_in(client, olga)
    detail = client.get(reverse("tasks:detail", args=[task.pk])).content.decode()
    confirm_url = reverse("tasks:cancel_confirm", args=[task.pk])
    assert f'href="{confirm_url}"' in detail and f'hx-get="{confirm_url}"' in detail
    assert f'action="{reverse("tasks:cancel", args=[task.pk])}"' not in detail  # no one-click cancel
    page = client.get(confirm_url).content.decode()
    assert "Cancel this task?" in page and "Yes, cancel the task" in page and "Keep it running" in page
    fragment = client.get(confirm_url, headers={"HX-Request": "true"}).content.decode()
    assert fragment.lstrip().startswith('<section class="card cancel-confirm"') and "<html" not in fragment
    assert Task.objects.get(pk=task.pk).cancel_requested_at is None  # asking is not cancelling
    answer = client.post(reverse("tasks:cancel", args=[task.pk]), headers={"HX-Request": "true"}).content.decode()
    assert f'id="task-{task.pk}-cancel-confirm" class="cancel-confirm-slot" hx-swap-oob="true"></div>' in answer
    assert "There is nothing to cancel" in client.get(confirm_url).content.decode()
