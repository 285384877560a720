"""Roles read once per HTTP request (taskhub.accounts.permissions.roles_of asks the database once, not per question)."""

from asgiref.sync import iscoroutinefunction
from django.utils.decorators import sync_and_async_middleware

from taskhub.accounts.permissions import roles_this_request


@sync_and_async_middleware
def roles_once_per_request(get_response):
    if iscoroutinefunction(get_response):

        async def async_middleware(request):
            token = roles_this_request.set({})
            try:
                return await get_response(request)
            finally:
                roles_this_request.reset(token)

        return async_middleware

    def middleware(request):
        token = roles_this_request.set({})
        try:
            return get_response(request)
        finally:
            roles_this_request.reset(token)

    return middleware
