from functools import wraps

from django.contrib.auth.views import redirect_to_login
from ninja.security import HttpBearer

from taskhub.api.tokens import active_token


class ApiTokenAuth(HttpBearer):
    """`Authorization: Bearer thk_…`; the request then acts as the token's user, with that user's roles, and
    `request.api_token` is the token (the agent), which the services record with what it does."""

    def authenticate(self, request, token):
        api_token = active_token(token)
        if api_token is None:
            return None
        request.user = api_token.user
        request.api_token = api_token
        return api_token.user


def signed_in_or_token(view):
    """The API's documentation (`/api/docs`, `/api/openapi.json`): for anyone signed in, whatever their role, or
    holding an API token; anybody else is sent to the sign-in page."""

    @wraps(view)
    def guarded(request, *args, **kwargs):
        if not request.user.is_authenticated and ApiTokenAuth()(request) is None:
            return redirect_to_login(request.get_full_path())
        return view(request, *args, **kwargs)

    return guarded
