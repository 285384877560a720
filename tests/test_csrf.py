"""Every POST of the pages needs the CSRF token: without it Django refuses with 403 and nothing changes."""

import pytest
from django.test import Client

from taskhub.accounts.groups import ADMINS, APPROVERS, OPERATORS
from taskhub.audit.models import AuditEvent
from tests.account_fixtures import make_user

pytestmark = pytest.mark.django_db

POSTS = [
    "/tasks/5f0c8a52-0d6e-4d38-9a52-1f0e6c0d2b71/cancel",  # fixed: parallel workers must collect the same ids
    "/inbox/1/answer",
    "/servers/add/",
    "/servers/1/edit/",
    "/servers/1/discover",
    "/launch/1/approval/",
    "/accounts/logout/",
]


@pytest.mark.parametrize("path", POSTS)
def test_a_post_without_the_csrf_token_is_refused(path):
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("ada", ADMINS, OPERATORS, APPROVERS))
    events = AuditEvent.objects.count()
    response = client.post(path, {"action": "accept", "name": "x", "transport": "http", "url": "http://x/mcp"})
    assert response.status_code == 403
    assert b"CSRF" in response.content
    assert AuditEvent.objects.count() == events
