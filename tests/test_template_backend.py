"""taskhub.web.template_backend: a page rendered leaves no reference cycle behind. Its context (a page's cards, tasks
and forms) is freed by reference counting when the page is done, not left to the cyclic collector (bench/pages.py)."""

import weakref

import pytest
from django.contrib.auth.models import AnonymousUser
from django.template import engines
from django.test import RequestFactory

from taskhub.web import template_backend

pytestmark = pytest.mark.django_db


class Shown:
    def __str__(self) -> str:
        return "shown"


def test_a_page_rendered_with_its_request_frees_its_context_without_the_cyclic_collector(no_cyclic_collection):
    engine = engines["django"]
    assert isinstance(engine, template_backend.DjangoTemplates)
    request = RequestFactory().get("/")
    request.user = AnonymousUser()
    template = engine.from_string("{% for each in things %}<p>{{ each }}</p>{% endfor %}{% csrf_token %}")
    shown = Shown()
    alive = weakref.ref(shown)
    assert "<p>shown</p>" in template.render({"things": [shown]}, request)
    del shown
    assert alive() is None, "the context is in a reference cycle"
