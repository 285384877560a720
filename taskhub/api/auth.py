from ninja.security import HttpBearer

from taskhub.api.tokens import user_for_token


class ApiTokenAuth(HttpBearer):
    """`Authorization: Bearer thk_…`; the request then acts as the token's user, with that user's roles."""

    def authenticate(self, request, token):
        user = user_for_token(token)
        if user is not None:
            request.user = user
        return user
