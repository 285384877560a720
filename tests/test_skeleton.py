"""The project's parts are wired together."""

from django.conf import settings
from django.core.management import call_command


def test_django_system_checks_pass():
    call_command("check", fail_level="WARNING")


def test_asgi_application_routes_http():
    from channels.routing import ProtocolTypeRouter

    from taskhub.asgi import application

    assert isinstance(application, ProtocolTypeRouter)
    assert "http" in application.application_mapping


def test_installed_apps():
    for app in ("daphne", "channels", "django_htmx", "procrastinate.contrib.django", "taskhub.web"):
        assert app in settings.INSTALLED_APPS
    assert settings.INSTALLED_APPS[0] == "daphne"
