"""Single sign-on's parts without a provider (issue 35, item 1; the provider's flow is tests/browser/test_sso.py): the
audit row of a password sign-in, the password form turned off, the groups map, the SSO pages when none is configured."""

import pytest
from django.core.cache import cache

from taskhub.accounts import sso
from taskhub.accounts.groups import ADMINS, APPROVERS, OPERATORS
from taskhub.audit.models import AuditEvent
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.helpers import free_port

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def empty_cache():
    cache.clear()
    yield
    cache.clear()


def sign_in(client, username, password):
    return client.post("/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR="10.0.0.9")


def test_a_password_sign_in_is_audited_as_one(client):
    make_user("olga", OPERATORS, password=TEST_PASSWORD)
    assert sign_in(client, "olga", TEST_PASSWORD).status_code == 302
    event = AuditEvent.objects.get(action="person.signed_in")
    assert event.data == {"person": "olga", "method": "password"}
    assert event.actor.username == "olga"


def test_with_local_passwords_off_the_form_is_gone_and_a_right_password_refused(client, settings):
    settings.TASKHUB_LOCAL_PASSWORDS = False
    make_user("olga", OPERATORS, password=TEST_PASSWORD)
    page = client.get("/accounts/login/").content.decode()
    assert 'name="password"' not in page
    response = sign_in(client, "olga", TEST_PASSWORD)
    assert response.status_code == 403
    assert "Passwords are turned off here" in response.content.decode()
    assert "_auth_user_id" not in client.session
    assert not AuditEvent.objects.filter(action="person.signed_in").exists()
    # Django's admin sign-in asks the same backend.
    response = client.post("/admin/login/", {"username": "olga", "password": TEST_PASSWORD}, REMOTE_ADDR="10.0.0.9")
    assert "_auth_user_id" not in client.session


def test_the_providers_groups_map_to_role_groups_only(settings):
    settings.TASKHUB_OIDC_GROUPS_CLAIM = "roles"
    settings.TASKHUB_OIDC_GROUP_ROLES = {"eng": [OPERATORS, APPROVERS], "boss": [ADMINS], "odd": ["superusers"]}
    assert sso.role_groups_for({"roles": ["eng", "sales", "odd"]}) == {OPERATORS, APPROVERS}
    assert sso.role_groups_for({"roles": "boss"}) == {ADMINS}
    assert sso.role_groups_for({"groups": ["boss"]}) == set()


def test_without_a_provider_the_sign_in_page_has_no_button_and_its_pages_are_404(client, settings):
    settings.TASKHUB_OIDC_ISSUER = ""
    assert "sso-signin" not in client.get("/accounts/login/").content.decode()
    assert client.get("/accounts/sso/").status_code == 404
    assert client.get("/accounts/sso/callback/?code=x&state=y").status_code == 404


def test_a_provider_that_cannot_be_reached_sends_back_to_the_sign_in_page_saying_so(client, settings):
    sso.discovery.cache_clear()
    settings.TASKHUB_OIDC_ISSUER = f"http://127.0.0.1:{free_port()}/realms/nobody"  # nothing listens there
    settings.OIDC_RP_CLIENT_ID = "taskhub"
    try:
        response = client.get("/accounts/sso/")
        assert response.status_code == 302 and response["Location"] == "/accounts/login/?sso=failed"
        page = client.get(response["Location"]).content.decode()
        assert "did not succeed" in page
    finally:
        sso.discovery.cache_clear()


def test_the_provider_cannot_sign_in_to_a_local_account_nor_a_deactivated_one(rf, settings):
    for name in (
        "OIDC_OP_AUTHORIZATION_ENDPOINT",
        "OIDC_OP_TOKEN_ENDPOINT",
        "OIDC_OP_USER_ENDPOINT",
        "OIDC_OP_JWKS_ENDPOINT",
    ):
        setattr(settings, name, "http://127.0.0.1:9/unused")  # no discovery: nothing is asked of a provider here
    settings.TASKHUB_OIDC_ISSUER = "https://idp.example.com"
    settings.OIDC_RP_CLIENT_ID = "taskhub"
    settings.TASKHUB_OIDC_GROUP_ROLES = {"ops": [OPERATORS]}
    make_user("root", ADMINS, password=TEST_PASSWORD)
    gone = make_user("gone", is_active=False)
    backend = sso.SsoBackend()
    request = rf.get("/accounts/sso/callback/")
    request.session = {}
    backend.request = request
    root = backend.filter_users_by_claims({"preferred_username": "root"}).get()
    assert backend.update_user(root, {"preferred_username": "root", "groups": ["ops"]}) is None
    assert backend.update_user(gone, {"preferred_username": "gone", "groups": ["ops"]}) is None
    ada = backend.create_user({"preferred_username": "ada", "email": "ada@example.com", "groups": ["ops", "x"]})
    assert ada is not None and not ada.has_usable_password()
    assert set(ada.groups.values_list("name", flat=True)) == {OPERATORS}
    assert request.session[sso.SESSION_ISSUER] == "https://idp.example.com"
    assert set(root.groups.values_list("name", flat=True)) == {ADMINS}
