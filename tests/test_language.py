"""Two languages (issue 35 item 2): each person's choice on their profile, the browser's by default, and the
zh-Hans catalogue compiled as committed."""

import subprocess
from pathlib import Path

import pytest
from django.conf import settings
from django.urls import reverse

from taskhub.accounts.models import Profile
from tests.account_fixtures import TEST_PASSWORD, make_user

CATALOGUE = Path(settings.BASE_DIR) / "locale" / "zh_Hans" / "LC_MESSAGES"


def test_the_committed_mo_is_the_po_compiled(tmp_path):
    """A .po edited without `manage.py compilemessages` would leave the pages in the old words."""
    compiled = tmp_path / "django.mo"
    subprocess.run(["msgfmt", "--check", "-o", str(compiled), str(CATALOGUE / "django.po")], check=True)
    assert compiled.read_bytes() == (CATALOGUE / "django.mo").read_bytes(), "run manage.py compilemessages"


def test_the_catalogue_is_complete():
    """No message of the zh-Hans catalogue is left untranslated or fuzzy."""
    result = subprocess.run(
        ["msgfmt", "--statistics", "-o", "/dev/null", str(CATALOGUE / "django.po")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "untranslated" not in result.stderr and "fuzzy" not in result.stderr, result.stderr


@pytest.mark.django_db
def test_the_browser_language_by_default_then_the_persons_choice(client):
    make_user("mei", password=TEST_PASSWORD)
    client.login(username="mei", password=TEST_PASSWORD)
    page = reverse("notifications:preferences")
    english = client.get(page)
    assert '<html lang="en">' in english.text and "Notifications" in english.text
    chinese = client.get(page, headers={"accept-language": "zh-CN,zh;q=0.9"})
    assert '<html lang="zh-hans">' in chinese.text and "通知" in chinese.text

    response = client.post(reverse("accounts:language"), {"language": "zh-hans", "next": page})
    assert response.status_code == 302 and response.url == page
    assert Profile.objects.get(user__username="mei").language == "zh-hans"
    assert "通知" in client.get(page, headers={"accept-language": "en"}).text  # the choice over the browser's

    client.logout()  # a new session: the profile's choice comes back at sign-in
    client.login(username="mei", password=TEST_PASSWORD)
    assert '<html lang="zh-hans">' in client.get(page).text

    client.post(reverse("accounts:language"), {"language": ""})  # back to the browser's
    assert Profile.objects.get(user__username="mei").language == ""
    assert '<html lang="en">' in client.get(page, headers={"accept-language": "en"}).text


@pytest.mark.django_db
def test_an_unknown_language_or_a_foreign_next_is_refused(client):
    make_user("mei", password=TEST_PASSWORD)
    client.login(username="mei", password=TEST_PASSWORD)
    assert client.post(reverse("accounts:language"), {"language": "xx"}).status_code == 400
    response = client.post(reverse("accounts:language"), {"language": "en", "next": "https://evil.example/"})
    assert response.url == reverse("notifications:preferences")


@pytest.mark.django_db
def test_home_and_the_task_list_in_chinese(client):
    """The pages marked so far say nothing of taskhub's own in English (the browser test walks every page)."""
    from taskhub.accounts.groups import OPERATORS

    client.force_login(make_user("mei", OPERATORS))
    for url in (reverse("web:home"), reverse("tasks:list")):
        page = client.get(url, headers={"accept-language": "zh-Hans"}).text
        assert '<html lang="zh-hans">' in page
        for english in ("Launch a tool", "Needs attention", "Sign out", "How the work is going", "No tasks yet"):
            assert english not in page, (url, english)
    assert "启动工具" in page and "还没有任务" in page


def test_a_deadline_in_chinese_units_is_read_as_the_form_help_writes_it():
    """The policy form's help says "例如 30 分钟、4 小时、1 天" in Chinese: what it shows must be accepted."""
    import datetime

    from taskhub.approvals.models import parse_answer_within

    assert parse_answer_within("30 分钟") == datetime.timedelta(minutes=30)
    assert parse_answer_within("4小时") == datetime.timedelta(hours=4)
    assert parse_answer_within("1 天") == datetime.timedelta(days=1)
    assert parse_answer_within("45 秒") == datetime.timedelta(seconds=45)
    with pytest.raises(ValueError):
        parse_answer_within("4 月")


@pytest.mark.django_db
def test_what_a_view_and_a_service_say_back_is_in_the_readers_language(client):
    """A refusal from a service (people.add_person) and a message from a view (the inbox's answer to many) reach a
    Chinese reader in Chinese; English readers keep the English (the other tests read it)."""
    from taskhub.accounts.groups import ADMINS, APPROVERS

    client.force_login(make_user("mei", ADMINS, APPROVERS))
    client.post(reverse("accounts:language"), {"language": "zh-hans"})
    taken = client.post(reverse("people:list"), {"username": "MEI", "email": ""})
    assert taken.status_code == 400 and "用户名“MEI”已被占用" in taken.text and "is taken" not in taken.text
    answered = client.post(reverse("tasks:answer_like"), {"action": "accept"}, follow=True)
    assert "请至少选择一个要回答的请求" in answered.text and "Select at least one" not in answered.text


def test_a_duration_in_chinese():
    """The one duration formatter says its units in the reader's language (Home's percentiles, a task's run)."""
    from django.utils import translation

    from taskhub.tasks.durations import duration_text

    with translation.override("zh-hans"):
        assert duration_text(90) == "1 分钟 30 秒"
        assert duration_text(2 * 86_400 + 3_600) == "2 天 1 小时"
        assert duration_text(0.02) == "20 毫秒"


@pytest.mark.django_db
def test_a_page_that_is_not_there_says_so_in_the_readers_language(client):
    """Django's own 404 page is English only: taskhub's (templates/404.html) is translated, for everyone signed in
    or not; the API's stays JSON."""
    chinese = client.get("/no-such-page/", headers={"accept-language": "zh-CN,zh;q=0.9"})
    assert chinese.status_code == 404 and "没有这个页面" in chinese.text and "Not Found" not in chinese.text
    english = client.get("/no-such-page/", headers={"accept-language": "en"})
    assert english.status_code == 404 and "There is no such page" in english.text
    assert client.get("/api/no-such-endpoint").json()["error"] == "No such API endpoint."


def test_the_server_error_page_in_the_readers_language(rf):
    """templates/500.html reads nothing (the failure may be the database's) but the language the request had."""
    from django.utils import translation

    from taskhub.api.errors import server_error

    with translation.override("zh-hans"):
        chinese = server_error(rf.get("/tasks/")).content.decode()
    assert '<html lang="zh-hans">' in chinese and "服务器出错了" in chinese
    with translation.override("en"):
        english = server_error(rf.get("/tasks/")).content.decode()
    assert '<html lang="en">' in english and "Something went wrong on the server" in english


@pytest.mark.django_db
def test_the_choices_of_a_select_are_translated_too(client):
    """The browser walk leaves a select's options out (they name servers, tools and groups as they are): the words
    taskhub puts among them, an empty choice and "any server", are checked here."""
    from taskhub.accounts.groups import ADMINS, APPROVERS
    from taskhub.servers.services import create_server

    create_server(name="alpha", transport="http", url="http://127.0.0.1:9/mcp", user=None)
    client.force_login(make_user("mei", ADMINS, APPROVERS))
    client.post(reverse("accounts:language"), {"language": "zh-hans"})
    policy_form = client.get(reverse("approvals:add")).text
    assert "- 请选择 -" in policy_form and "Select an option" not in policy_form
    inbox = client.get(reverse("tasks:inbox")).text
    assert "any server" not in inbox and "requests whose policy names me" not in inbox


@pytest.mark.django_db
def test_a_tasks_timeline_names_its_server_log_lines_and_progress_in_the_readers_language(alpha, olga):
    """The timeline's own words for what a server logged and reported; the server's text stays as sent."""
    from django.utils import timezone, translation

    from taskhub.tasks import presenters
    from taskhub.tasks.services.progress import LogLine, record_server_log
    from tests.task_page_fixtures import durable

    task = durable(alpha, olga)
    record_server_log(task_id=task.pk, lines=[LogLine(at=timezone.now(), level="info", logger="", data="warming up")])
    task.refresh_from_db()
    with translation.override("zh-hans"):
        entries, _ = presenters.timeline(task)
    logged = next(entry for entry in entries if entry.action == "server.log")
    assert logged.description.startswith("服务器日志") and logged.description.endswith("info")
    assert logged.data == "warming up"
