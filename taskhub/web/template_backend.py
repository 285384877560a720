"""Django's template backend, less a reference cycle per render.

Django renders a page in a RequestContext that holds the view's context as a ContextDict pushed onto it, and a
ContextDict holds its context: context -> dicts -> ContextDict -> context. Nothing pops it, so every page rendered
left its whole context (the inbox's 50 cards with their requests, forms and events; a list's 50 tasks) as cyclic
garbage, some 1,700 objects a page that only the cyclic collector could free: with its young threshold at 50,000
(taskhub/runtime.py) a collection every few dozen pages, 25-35 ms each, landing on one request (bench/pages.py).
Emptying the context's stack once the page is rendered leaves nothing in a cycle: reference counting frees it all
at once.
"""

from django.template import TemplateDoesNotExist
from django.template.backends import django as django_backend
from django.template.context import make_context


class DjangoTemplates(django_backend.DjangoTemplates):
    def from_string(self, template_code):
        return Template(super().from_string(template_code).template, self)

    def get_template(self, template_name):
        return Template(super().get_template(template_name).template, self)


class Template(django_backend.Template):
    def render(self, context=None, request=None):
        context = make_context(context, request, autoescape=self.backend.engine.autoescape)
        try:
            return self.template.render(context)
        except TemplateDoesNotExist as exc:
            django_backend.reraise(exc, self.backend)
        finally:
            # The pushed ContextDicts hold the context: emptied, nothing of the page is left in a cycle.
            context.dicts.clear()
