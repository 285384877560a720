"""/healthz answers whatever the Host header says; a request's live publishes go out after its response; the
middleware chain runs on the request's thread in one go.

Health probes (Docker's HEALTHCHECK, Kubernetes, load balancers) address a web process by its IP, often
127.0.0.1, which is not among a production ALLOWED_HOSTS: Django would refuse them with 400 and the process would
be marked unhealthy. For /healthz only, a Host that is not allowed is not refused: the request is answered as an
anonymous one, before any middleware reads the Host. Nothing in that answer is built from the Host header, so the
check it skips (protection against forged links and cache poisoning) has nothing to protect there. Any other path,
and /healthz with an allowed Host (where an admin's session shows the database version), goes through as usual.
"""

import functools
import weakref

from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import DisallowedHost

from taskhub.live import publish
from taskhub.web import views

HEALTHZ_PATH = "/healthz"


def healthz_for_any_host(get_response):
    def middleware(request):
        if request.path_info == HEALTHZ_PATH and not _host_allowed(request):
            request.user = AnonymousUser()
            return views.healthz(request)
        return get_response(request)

    return middleware


def _host_allowed(request) -> bool:
    try:
        request.get_host()
    except DisallowedHost:
        return False
    return True


def publishes_after_response(get_response):
    """The changes a request commits are published to the live sockets once its response has gone out (when Django
    closes it: after the last byte under daphne, before the test client returns it), not as each commits.

    The sockets' renderings run in this process (daphne's live threads) and took the interpreter from the request's
    own thread: an approver's Accept came back 30 ms after the click, 21-24 with them sent after it, 20 with none
    (bench/approval.py); the worker sending the answer to the server shares the two cores with them all the same. A
    streaming response's publishes are sent as the view returns it (its close comes when the stream ends)."""

    def middleware(request):
        held, token = publish.hold_publishes()
        try:
            response = get_response(request)
        except BaseException:
            publish.send_held(held)  # committed all the same
            raise
        finally:
            publish.stop_holding(token)
        if held:
            if response.streaming:
                publish.send_held(held)
            else:
                response._resource_closers.append(functools.partial(publish.send_held, held))
                # A response never closed (its client left while the view ran): they go as it is freed.
                weakref.finalize(response, publish.send_held, held)
        return response

    return middleware


def middleware_on_one_thread(get_response):
    """Last in MIDDLEWARE, and sync only: every middleware above it then runs synchronously on the request's
    thread, in one trip from daphne's event loop, in Django's async chain, which taskhub's ASGI handler keeps for
    async views (the gateway; every other request runs the sync chain: taskhub.web.request_threads.OneTripHandler).

    Under ASGI, Django runs a middleware that can run both ways asynchronously, and MiddlewareMixin's async path
    sends each process_request and process_response to the request's thread and back: about 18 trips through
    the event loop for one request, each waiting behind whatever else the loop does (live sockets, other
    requests). With this one below the others, Django adapts the chain to sync once at the top."""
    return get_response
