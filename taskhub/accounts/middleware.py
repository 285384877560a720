"""Roles read once per HTTP request (taskhub.accounts.permissions.roles_of asks the database once, not per question),
and so are the answer terms of a server's tool (permissions.answer_terms: an inbox page asks once per card) and
whether its policy names the user (permissions.policy_allows: the answer view and the answer service both ask)."""

from asgiref.sync import iscoroutinefunction
from django.utils.decorators import sync_and_async_middleware

from taskhub.accounts.permissions import allowed_this_request, roles_this_request, terms_this_request


@sync_and_async_middleware
def roles_once_per_request(get_response):
    if iscoroutinefunction(get_response):

        async def async_middleware(request):
            token, terms, allowed = roles_this_request.set({}), terms_this_request.set({}), allowed_this_request.set({})
            try:
                return await get_response(request)
            finally:
                allowed_this_request.reset(allowed)
                terms_this_request.reset(terms)
                roles_this_request.reset(token)

        return async_middleware

    def middleware(request):
        token, terms, allowed = roles_this_request.set({}), terms_this_request.set({}), allowed_this_request.set({})
        try:
            return get_response(request)
        finally:
            allowed_this_request.reset(allowed)
            terms_this_request.reset(terms)
            roles_this_request.reset(token)

    return middleware
