"""Roles read once per HTTP request (taskhub.accounts.permissions.roles_of asks the database once, not per question),
and so are the answer terms of a server's tool (permissions.answer_terms: an inbox page asks once per card) and
whether its policy names the user (permissions.policy_allows: the answer view and the answer service both ask)."""

from asgiref.sync import iscoroutinefunction
from django.utils.decorators import sync_and_async_middleware

from taskhub.accounts.permissions import read_once


@sync_and_async_middleware
def roles_once_per_request(get_response):
    if iscoroutinefunction(get_response):

        async def async_middleware(request):
            with read_once():
                return await get_response(request)

        return async_middleware

    def middleware(request):
        with read_once():
            return get_response(request)

    return middleware
