"""A refused request logs one line without a traceback, in the logging configuration taskhub runs with
(settings.LOGGING, which the tests keep): issue 15 item 9. A Host not in ALLOWED_HOSTS, which Django logs at ERROR,
is a warning. tests/test_containers.py checks the same against a production daphne."""

import io
import logging

import pytest
from django.test import Client

from taskhub.accounts.groups import APPROVERS
from taskhub.web.logs import RefusalsWithoutTraceback
from tests.account_fixtures import make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def console():
    """What taskhub's console handler (the one with the refusals filter, on the root logger) writes."""
    handler = next(
        h for h in logging.getLogger().handlers if any(isinstance(f, RefusalsWithoutTraceback) for f in h.filters)
    )
    stream = io.StringIO()
    previous = handler.setStream(stream)
    yield stream
    handler.setStream(previous)


def test_each_refusal_is_one_line_without_traceback_and_a_bad_host_a_warning(console, settings, caplog):
    settings.ALLOWED_HOSTS = ["taskhub.example"]
    client = Client(headers={"Host": "taskhub.example"})
    client.force_login(make_user("arun", APPROVERS))
    assert Client(headers={"Host": "evil.example"}).get("/accounts/login/").status_code == 400
    assert client.get("/servers/").status_code == 403
    assert client.get("/no-such-page/").status_code == 404
    assert client.post("/tokens/", {"name": ""}).status_code == 400

    lines = console.getvalue().splitlines()
    assert "Traceback" not in console.getvalue(), lines
    expected = {
        "WARNING django.security.DisallowedHost: Invalid HTTP_HOST header: 'evil.example'": 1,
        "WARNING django.request: Forbidden (Permission denied): /servers/": 1,
        "WARNING django.request: Not Found: /no-such-page/": 1,
        "WARNING django.request: Bad Request: /tokens/": 1,
    }
    for text, count in expected.items():
        assert len([line for line in lines if text in line]) == count, (text, lines)
    assert len(lines) == len(expected), lines
    # Every handler sees the Host refusal as a warning without its exception, not only the console.
    refused = [record for record in caplog.records if record.name == "django.security.DisallowedHost"]
    assert [(record.levelname, record.exc_info) for record in refused] == [("WARNING", None)]
