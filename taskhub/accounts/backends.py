"""Django's ModelBackend, refusing every password while the sign-in rate limit is reached (ratelimit.py).

The sign-in page checks the limit itself first (to answer 429 with the wait); this backend makes every other
password form, Django's admin sign-in included, obey the same limit.
"""

from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied

from taskhub.accounts import ratelimit


class RateLimitedModelBackend(ModelBackend):
    def authenticate(self, request, username=None, password=None, **kwargs):
        if (
            request is not None
            and username
            and ratelimit.seconds_locked(str(username), ratelimit.client_address(request))
        ):
            raise PermissionDenied("Too many sign-in attempts.")  # authenticate() stops at once and reports a failure
        return super().authenticate(request, username=username, password=password, **kwargs)
