"""Django's ModelBackend, counting each guess before its password is checked and refusing it while the sign-in
rate limit is reached (ratelimit.py), so every password form, Django's admin sign-in included, obeys the limit,
however many attempts arrive at once.
"""

from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied

from taskhub.accounts import ratelimit


class RateLimitedModelBackend(ModelBackend):
    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None or not (username and password):
            return super().authenticate(request, username=username, password=password, **kwargs)
        with ratelimit.one_of_few_sign_ins():  # a burst of sign-ins must not take a connection each
            guessed_at, wait = ratelimit.reserve_attempt(str(username), ratelimit.client_address(request))
            if guessed_at is None:
                setattr(request, ratelimit.REFUSED_ATTRIBUTE, wait)
                raise PermissionDenied("Too many sign-in attempts.")  # authenticate() stops at once: a failure
            setattr(request, ratelimit.GUESS_ATTRIBUTE, guessed_at)
            return super().authenticate(request, username=username, password=password, **kwargs)
