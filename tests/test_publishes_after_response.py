"""A web request's live publishes go out once its response has (taskhub.web.middleware.publishes_after_response): the
sockets' renderings no longer take the interpreter from the request that answers the person who made the change."""

import contextvars
import gc
import threading
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


def test_a_response_never_closed_has_them_sent_as_it_is_freed(sent):
    """Its client left while the view ran: the handler never sends nor closes the response it was cancelled for."""

    def view(request):
        publish.publish_task_changed(TASK, server_id=7)
        return HttpResponse("answered")

    response = publishes_after_response(view)(request())
    assert sent == []
    del response
    gc.collect()
    assert sent == [(TASK, 7, False)]


def test_what_the_request_hands_to_another_thread_publishes_at_once(sent):
    """A thread or loop the view starts inherits its context (the gateway's sender records a call's outcome while
    the agent's request waits for it): its publishes are not the request's to hold."""

    def view(request):
        in_its_context = contextvars.copy_context().run  # as asgiref and run_coroutine_threadsafe hand it on
        elsewhere = threading.Thread(
            target=in_its_context, args=(publish.publish_task_changed, TASK), kwargs={"server_id": 8}
        )
        elsewhere.start()
        elsewhere.join()
        assert sent == [(TASK, 8, False)]
        publish.publish_task_changed(TASK, server_id=7)
        return HttpResponse("answered")

    publishes_after_response(view)(request()).close()
    assert sent == [(TASK, 8, False), (TASK, 7, False)]


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
