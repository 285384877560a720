"""People management for admins (issue 34, Deliver 2 and item 6): the services (taskhub/accounts/people.py), the
People pages and `manage.py people`. In a browser, deactivating someone whose page is open:
tests/browser/test_people.py."""

import io

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.sessions.models import Session
from django.core.management import CommandError, call_command
from django.test import Client

from taskhub.accounts import people
from taskhub.accounts.groups import ADMINS, APPROVERS, OPERATORS
from taskhub.api.models import ApiToken
from taskhub.api.tokens import create_token, user_for_token
from taskhub.audit.models import AuditEvent
from tests.account_fixtures import make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def alex():
    return make_user("alex", ADMINS)


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_an_admin_adds_a_person_who_signs_in_with_the_password_shown_once(alex):
    page = signed_in(alex).post(
        "/people/",
        {"username": "dana", "email": "dana@example.com", "groups": [Group.objects.get(name=APPROVERS).pk]},
    )
    assert page.status_code == 200
    password = page.context["added"]["password"]
    assert password in page.content.decode()
    dana = get_user_model().objects.get(username="dana")
    assert list(dana.groups.values_list("name", flat=True)) == [APPROVERS] and dana.email == "dana@example.com"
    assert Client().login(username="dana", password=password)
    assert AuditEvent.objects.get(action="person.added").data == {"person": "dana", "groups": [APPROVERS]}

    again = signed_in(alex).post("/people/", {"username": "DANA"})
    assert again.status_code == 400 and "is taken" in again.content.decode()
    assert get_user_model().objects.filter(username__iexact="dana").count() == 1


def test_an_admin_sets_groups_and_the_last_admin_keeps_the_role(alex):
    olga = make_user("olga", OPERATORS)
    operators, approvers = Group.objects.get(name=OPERATORS), Group.objects.get(name=APPROVERS)
    response = signed_in(alex).post(f"/people/{olga.pk}/", {"groups": [operators.pk, approvers.pk]})
    assert response.status_code == 302
    assert sorted(olga.groups.values_list("name", flat=True)) == [APPROVERS, OPERATORS]
    assert AuditEvent.objects.get(action="person.groups_changed").data["to"] == [APPROVERS, OPERATORS]

    refused = signed_in(alex).post(f"/people/{alex.pk}/", {"groups": [operators.pk]})
    assert refused.status_code == 400 and "last active admin" in refused.content.decode()
    assert list(alex.groups.values_list("name", flat=True)) == [ADMINS]


def test_deactivating_ends_sessions_and_revokes_tokens_and_changes_nothing_when_refused(alex):
    olga = make_user("olga", OPERATORS)
    olgas_page = signed_in(olga)
    assert olgas_page.get("/tasks/").status_code == 200
    token, secret = create_token(user=olga, name="script")
    other = signed_in(make_user("pete", APPROVERS))  # someone else's session stays

    response = signed_in(alex).post(f"/people/{olga.pk}/state", {"active": "no"}, follow=True)
    assert "1 session(s) ended, 1 API token(s) revoked" in response.content.decode()
    olga.refresh_from_db()
    assert not olga.is_active
    assert olgas_page.get("/tasks/").status_code == 302  # to the sign-in
    assert other.get("/tokens/").status_code == 200
    assert user_for_token(secret) is None and ApiToken.objects.get(pk=token.pk).revoked_at is not None
    assert AuditEvent.objects.get(action="person.deactivated").data == {"person": "olga", "sessions": 1, "tokens": 1}
    assert AuditEvent.objects.filter(action="api_token.revoked", actor_label="alex").count() == 1

    refused = signed_in(alex).post(f"/people/{alex.pk}/state", {"active": "no"}, follow=True)
    assert "You cannot deactivate yourself" in refused.content.decode()
    alex.refresh_from_db()
    assert alex.is_active

    signed_in(alex).post(f"/people/{olga.pk}/state", {"active": "yes"})
    olga.refresh_from_db()
    assert olga.is_active and user_for_token(secret) is None  # the old token stays revoked


def test_a_reset_password_is_shown_once_and_ends_the_persons_sessions(alex):
    olga = make_user("olga", OPERATORS, password="an old password of hers")
    olgas_page = signed_in(olga)
    unconfirmed = signed_in(alex).post(f"/people/{olga.pk}/password", follow=True)
    assert "tick the box" in unconfirmed.content.decode()
    page = signed_in(alex).post(f"/people/{olga.pk}/password", {"confirm": "yes"})
    password = page.context["password"]
    assert password in page.content.decode()
    assert olgas_page.get("/tasks/").status_code == 302
    assert Client().login(username="olga", password=password)
    assert not Client().login(username="olga", password="an old password of hers")
    assert AuditEvent.objects.get(action="person.password_reset").data["person"] == "olga"


def test_the_command_adds_sets_groups_deactivates_and_resets(alex, monkeypatch):
    out = io.StringIO()
    call_command("people", "add", "sam", "--group", OPERATORS, "--email", "sam@example.com", stdout=out)
    password = out.getvalue().rsplit(": ", 1)[1].strip()
    assert Client().login(username="sam", password=password)
    call_command("people", "groups", "sam", "--group", APPROVERS, stdout=io.StringIO())
    sam = get_user_model().objects.get(username="sam")
    assert list(sam.groups.values_list("name", flat=True)) == [APPROVERS]
    with pytest.raises(CommandError, match="No group named nobody"):
        call_command("people", "add", "kim", "--group", "nobody")
    assert not get_user_model().objects.filter(username="kim").exists()

    monkeypatch.setattr("sys.stdin", io.StringIO("a long chosen passphrase\n"))
    call_command("people", "reset-password", "sam", "--password-stdin", stdout=io.StringIO())
    assert Client().login(username="sam", password="a long chosen passphrase")
    signed_in(sam)
    out = io.StringIO()
    call_command("people", "deactivate", "sam", stdout=out)
    assert "2 session(s) ended" in out.getvalue()  # the sign-in checked above, and signed_in
    assert AuditEvent.objects.get(action="person.deactivated").actor_label == people.COMMAND
    assert not Session.objects.exists() or all(
        s.get_decoded().get("_auth_user_id") != str(sam.pk) for s in Session.objects.all()
    )
    with pytest.raises(CommandError, match="Nobody is called"):
        call_command("people", "deactivate", "nobody")
