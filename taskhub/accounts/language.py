"""The language taskhub speaks to a person: their choice, stored on their Profile, else the browser's.

Django's LocaleMiddleware picks the browser's (Accept-Language) for everyone; the choice overrides it from the session,
where sign-in copies it from the profile (so a page costs no query for it), and where choosing it writes it too."""

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.http import HttpRequest
from django.utils import translation
from django.utils.decorators import sync_and_async_middleware

SESSION_KEY = "taskhub_language"
LANGUAGE_CODES = {code for code, _name in settings.LANGUAGES}


def _activate(request, language: str | None) -> None:
    if language and language in LANGUAGE_CODES:
        translation.activate(language)
        request.LANGUAGE_CODE = language


@sync_and_async_middleware
def persons_language(get_response):
    """After LocaleMiddleware and the session: the person's chosen language, when they chose one."""
    if iscoroutinefunction(get_response):

        async def async_middleware(request):
            _activate(request, await request.session.aget(SESSION_KEY))
            return await get_response(request)

        return async_middleware

    def middleware(request):
        _activate(request, request.session.get(SESSION_KEY))
        return get_response(request)

    return middleware


async def language_of_socket(scope) -> str:
    """The language a live socket's fragments are rendered in, as its pages are: the choice in the session, else the
    browser's (the WebSocket handshake carries Accept-Language), else LANGUAGE_CODE."""
    session = scope.get("session")
    chosen = await session.aget(SESSION_KEY) if session is not None else None
    if chosen in LANGUAGE_CODES:
        return chosen
    handshake = HttpRequest()
    for name, value in scope.get("headers") or ():
        if name == b"accept-language":
            handshake.META["HTTP_ACCEPT_LANGUAGE"] = value.decode("latin-1")
    return translation.get_language_from_request(handshake)


def on_logged_in(sender, request, user, **kwargs):
    """user_logged_in: the profile's language into the new session (none chosen: the browser's)."""
    from taskhub.accounts.models import Profile

    language = Profile.objects.filter(user=user).values_list("language", flat=True).first()
    if request is not None and hasattr(request, "session"):
        if language:
            request.session[SESSION_KEY] = language
        else:
            request.session.pop(SESSION_KEY, None)


def choose(request, *, language: str) -> None:
    """Store a person's choice ('' = the browser's) on their profile and in their session, and use it at once."""
    from taskhub.accounts.models import Profile

    Profile.objects.update_or_create(user=request.user, defaults={"language": language})
    if language:
        request.session[SESSION_KEY] = language
    else:
        request.session.pop(SESSION_KEY, None)
        language = translation.get_language_from_request(request)
    _activate(request, language)
