"""A web request's live publishes go out once its response has (taskhub.web.middleware.publishes_after_response): the
sockets' renderings no longer take the interpreter from the request that answers the person who made the change."""

import uuid

import pytest
from django.http import HttpResponse, StreamingHttpResponse
from django.test import RequestFactory

from taskhub.live import publish
from taskhub.web.middleware import publishes_after_response

# Closing a response sends request_finished, whose receiver checks the database connection.
pytestmark = pytest.mark.django_db

TASK = uuid.uuid4()


@pytest.fixture
def sent(monkeypatch):
    published = []
    monkeypatch.setattr(publish, "_publish", lambda *args: published.append(args))
    return published


def request():
    return RequestFactory().post("/inbox/requests/1/answer")


def test_held_while_the_view_runs_and_sent_when_the_response_is_closed(sent):
    def view(request):
        publish.publish_task_changed(TASK, server_id=7, asks=True)
        publish.publish_task_changed(TASK, server_id=7, asks=False)
        assert sent == []
        return HttpResponse("answered")

    response = publishes_after_response(view)(request())
    assert sent == []
    response.close()
    assert sent == [(TASK, 7, True), (TASK, 7, False)]  # in the order they were asked for
    response.close()
    assert len(sent) == 2


def test_a_streaming_responses_publishes_go_as_the_view_returns_it(sent):
    def view(request):
        publish.publish_task_changed(TASK, server_id=7)
        return StreamingHttpResponse(iter(["a long stream"]))

    publishes_after_response(view)(request())
    assert sent == [(TASK, 7, False)]


def test_a_view_that_raises_has_its_publishes_sent_all_the_same(sent):
    def view(request):
        publish.publish_task_changed(TASK, server_id=7)
        raise RuntimeError("after its commit")

    with pytest.raises(RuntimeError):
        publishes_after_response(view)(request())
    assert sent == [(TASK, 7, False)]


def test_outside_a_request_a_publish_goes_at_once(sent):
    publish.publish_task_changed(TASK, server_id=7)
    assert sent == [(TASK, 7, False)]
    publishes_after_response(lambda request: HttpResponse())(request()).close()
    publish.publish_task_changed(TASK, server_id=8)  # the holding ended with the request
    assert sent == [(TASK, 7, False), (TASK, 8, False)]
