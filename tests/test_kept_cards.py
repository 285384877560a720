"""The inbox's kept cards ({% kept card|card_shown %}, taskhub/web/templatetags/taskhub_rows.py): after any change a
card shows, the inbox has the card as it renders afresh; each reader gets their own view of it and their own CSRF
token, with which their answer goes through."""

import datetime
import re

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from taskhub.accounts.groups import APPROVERS
from taskhub.approvals.models import ApprovalPolicy
from taskhub.mcp.schema_fields import ELICITATION
from taskhub.servers.models import Server
from taskhub.tasks.input_cards import INPUT_REQUEST_SHOWN, TASK_SHOWN
from taskhub.tasks.models import InputRequest, Task
from taskhub.tasks.schema_forms import SchemaForm
from taskhub.tasks.services import request_cancel
from taskhub.web.templatetags import taskhub_rows
from tests.account_fixtures import make_user
from tests.inbox_fixtures import client_for, request_of, task_asking

pytestmark = pytest.mark.django_db

CARD_TEMPLATE = "templates/tasks/input_request_card.html"
FORM = {
    "method": "elicitation/create",
    "params": {
        "message": "Deploy?",
        "requestedSchema": {
            "type": "object",
            "properties": {"why": {"type": "string", "title": "Why"}, "size": {"type": "string", "enum": ["S", "L"]}},
            "required": ["why"],
        },
    },
}
TOKEN = re.compile(r'name="csrfmiddlewaretoken" value="[^"]*"')


@pytest.fixture
def dana(servers):
    return make_user("dana", APPROVERS, "team-alpha")


def card(client, request_id, language="en") -> str:
    page = client.get(reverse("tasks:inbox"), headers={"Accept-Language": language}).content.decode()
    found = re.search(rf'<article [^>]*id="ir-{request_id}".*?</article>', page, re.S)
    assert found, page[-2000:]
    return found.group(0)


def without_token(html: str) -> str:
    """Each response masks the reader's CSRF secret anew: the card less its token."""
    return TOKEN.sub("csrf", html)


def test_the_template_reads_of_the_request_and_task_only_what_the_key_holds():
    """A card is kept under what it shows of its request (ir) and task (input_cards.INPUT_REQUEST_SHOWN, TASK_SHOWN):
    a template that came to show more would keep cards that no longer read as they render."""
    with open(CARD_TEMPLATE) as template:
        text = template.read()
    derived = {"server", "get_status_display"}  # the server's name is in the key; the display is the status's
    assert set(re.findall(r"\bir\.(\w+)", text)) <= set(INPUT_REQUEST_SHOWN)
    assert set(re.findall(r"\btask\.(\w+)", text)) <= set(TASK_SHOWN) | derived
    assert set(re.findall(r"\btask\.server\.(\w+)", text)) == {"name"}


def test_a_kept_card_is_the_card_rendered_afresh_after_each_change_it_shows(servers, ada, dana, monkeypatch):
    alpha = servers[0]
    task = task_asking(alpha, {"form": FORM})
    asked = request_of(task, "form")
    client = client_for(ada)

    def afresh(language="en") -> str:
        monkeypatch.setattr(taskhub_rows, "_kept", {})
        return card(client, asked.pk, language)

    def shows(change, language="en") -> None:
        before = without_token(card(client, asked.pk, language))
        assert without_token(card(client, asked.pk, language)) == before  # kept
        change()
        after = without_token(card(client, asked.pk, language))
        assert after != before, change.__name__
        assert after == without_token(afresh(language)), change.__name__

    def server_renamed():
        Server.objects.filter(pk=alpha.pk).update(name="alpha-2")

    def ten_minutes_pass():
        later = timezone.now() + datetime.timedelta(minutes=10)
        monkeypatch.setattr(timezone, "now", lambda: later)

    def a_cancel_asked():  # an event before the question (asked within its seconds), and the task's status message
        request_cancel(task=task, user=ada)

    def a_deadline():
        InputRequest.objects.filter(pk=asked.pk).update(answer_deadline_at=timezone.now() + datetime.timedelta(hours=1))

    def two_must_accept():
        ApprovalPolicy.objects.filter(server=alpha).update(required_accepts=2)

    def dana_accepts():
        response = client_for(dana).post(reverse("tasks:answer", args=[asked.pk]), {"action": "accept", "f:why": "ok"})
        assert response.status_code == 302, response.content.decode()[:500]

    def the_task_works_on():
        Task.objects.filter(pk=task.pk).update(status="working")

    for change in (server_renamed, a_cancel_asked, ten_minutes_pass, a_deadline, two_must_accept, dana_accepts):
        shows(change)
    assert without_token(card(client, asked.pk, "zh-hans")) != without_token(card(client, asked.pk))
    shows(the_task_works_on, language="zh-hans")

    # dana's view of the card ada's was kept beside: "you accepted" is hers alone
    monkeypatch.setattr(taskhub_rows, "_kept", {})
    assert "you accepted" not in card(client, asked.pk)
    dana_kept = card(client_for(dana), asked.pk)
    assert "you accepted" in dana_kept
    monkeypatch.setattr(taskhub_rows, "_kept", {})
    assert without_token(dana_kept) == without_token(card(client_for(dana), asked.pk))


def test_each_reader_answers_with_their_own_token_from_a_kept_card(servers, ada, dana):
    asked = request_of(task_asking(servers[0], {"form": FORM}), "form")
    readers = []
    for user in (ada, dana):
        reader = Client(enforce_csrf_checks=True)
        reader.force_login(user)
        readers.append((reader, card(reader, asked.pk)))
    (ada_reader, ada_card), (dana_reader, dana_card) = readers
    assert without_token(ada_card) == without_token(dana_card)  # one card, kept: the same for both
    dana_token = re.search(r'name="csrfmiddlewaretoken" value="([^"]*)"', dana_card).group(1)
    assert taskhub_rows.CSRF_STAND_IN not in dana_card
    refused = ada_reader.post(
        reverse("tasks:answer", args=[asked.pk]),
        {"action": "accept", "f:why": "ada", "csrfmiddlewaretoken": dana_token},
    )
    assert refused.status_code == 403  # dana's token is not ada's
    answered = dana_reader.post(
        reverse("tasks:answer", args=[asked.pk]),
        {"action": "accept", "f:why": "dana", "csrfmiddlewaretoken": dana_token},
    )
    assert answered.status_code == 302
    asked.refresh_from_db()
    assert asked.answered_by == dana and asked.answer["content"]["why"] == "dana"


def test_what_cannot_be_told_apart_by_value_is_not_kept():
    assert taskhub_rows.shown_value({"a": [1, "b", None]}) == (("a", (1, "b", None)),)
    form = SchemaForm(FORM["params"]["requestedSchema"], use=ELICITATION)
    assert hash(taskhub_rows.shown_value(form))
    with pytest.raises(taskhub_rows._NotKept):
        taskhub_rows.shown_value(object())
    with pytest.raises(taskhub_rows._NotKept):
        taskhub_rows.shown_value(Server(name="x"))


def test_a_refused_answer_shows_the_card_again_with_what_was_posted_not_the_kept_card(servers, ada, monkeypatch):
    """The form's input and errors are in the card's key (SchemaForm.shown): the card shown again after a refusal is
    the one rendered afresh, with the person's input, not the empty one kept from the inbox."""
    schema = {
        "type": "object",
        "properties": {"count": {"type": "integer", "minimum": 1}, "size": {"type": "string", "enum": ["S", "L"]}},
        "required": ["count"],
    }
    asked = request_of(task_asking(servers[0], {"form": {**FORM, "params": {"requestedSchema": schema}}}), "form")
    client = client_for(ada)
    empty = card(client, asked.pk)
    posted = {"action": "accept", "f:count": "zero", "f:size": "L"}
    refused = client.post(reverse("tasks:answer", args=[asked.pk]), posted, headers={"HX-Request": "true"})
    again = refused.content.decode()
    assert 'value="zero"' in again and '<option value="L" selected>' not in empty
    monkeypatch.setattr(taskhub_rows, "_kept", {})
    afresh = client.post(reverse("tasks:answer", args=[asked.pk]), posted, headers={"HX-Request": "true"})
    assert without_token(again) == without_token(afresh.content.decode())
    # the same refusal, other input: only what is in the fields differs
    other = client.post(
        reverse("tasks:answer", args=[asked.pk]), {**posted, "f:count": "none"}, headers={"HX-Request": "true"}
    ).content.decode()
    assert 'value="none"' in other and 'value="zero"' not in other
