"""Daphne's requests without Twisted's parsing of form bodies, which nothing reads.

Twisted parses every POST's Content-Type (through the standard library's email headers) and reads an url-encoded or
multipart body into `request.args`, for Twisted's own web resources; daphne hands the body to the ASGI application
as it came, and Django parses it itself, within its limits (DATA_UPLOAD_MAX_*). Under the gateway's `tasks/get` the
Content-Type's parse was 5-7 % of daphne's samples (py-spy), and with it off daphne's CPU per request fell from 0.89
to 0.76-0.82 ms (bench/gateway.py); a large multipart body was also read twice into memory before Django saw it.
Twisted lets a request opt out (its `parsePOSTFormSubmission` argument; a Twisted without it parses as before):
daphne's requests are made with it off, where daphne is the server (imported before the application, as its command
line and `taskhub demo` do).
"""

import functools
import inspect
import sys


def no_form_parsing_in_daphne() -> bool:
    """Make daphne's requests with Twisted's form parsing off; False when this process is not daphne's."""
    protocol = sys.modules.get("daphne.http_protocol")
    if protocol is None:
        return False
    from twisted.web import http  # daphne's already: it installed its reactor before

    request = protocol.WebRequest
    if "parsePOSTFormSubmission" not in inspect.signature(http.Request.__init__).parameters:
        return False  # a Twisted older than the option: it parses, as before
    if getattr(request.__init__, "taskhub_no_form_parsing", False):
        return True
    made = request.__init__

    @functools.wraps(made)
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("parsePOSTFormSubmission", False)
        made(self, *args, **kwargs)

    __init__.taskhub_no_form_parsing = True
    request.__init__ = __init__
    return True
