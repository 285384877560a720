"""taskhub.acyclic_forms: a page's filter form, bound, validated and rendered with its server choices, is freed by
reference counting when the page drops it, not left to the cyclic collector with its deep-copied fields, widgets and
choices (about 200 objects for the task list's filter bar; bench/pages.py's GC column). Django's own form is not:
the same test fails with it."""

import weakref

import pytest
from django import forms

from taskhub.accounts.groups import ADMINS, APPROVERS, OPERATORS
from taskhub.servers.forms import ServerFilterField
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks.inbox_listing import InboxFilterForm
from taskhub.tasks.queries import TaskFilterForm
from tests.account_fixtures import make_user
from tests.inbox_fixtures import task_asking

pytestmark = pytest.mark.django_db


ASK = {"method": "elicitation/create", "params": {"message": "Go?", "requestedSchema": {"type": "object"}}}


class DjangosForm(forms.Form):
    server = forms.ModelChoiceField(queryset=Server.objects.all(), required=False)
    tool = forms.CharField(required=False)


def freed_without_the_collector(make_form) -> bool:
    form = make_form()
    assert form.is_valid(), form.errors
    html = str(form)  # every bound field made, every choice iterated
    assert "alpha" in html
    alive = weakref.ref(form)
    field = weakref.ref(form.fields["server"])
    del form
    return alive() is None and field() is None


def test_the_task_lists_and_the_inboxs_filter_forms_are_freed_by_reference_counting(no_cyclic_collection):
    server = create_server(name="alpha", transport="http", url="http://127.0.0.1:9/alpha", user=None)
    task_asking(server, {"go": ASK})  # a server is offered where it has tasks
    ada = make_user("ada", ADMINS, OPERATORS, APPROVERS)
    data = {"server": str(server.pk), "tool": "deploy"}
    assert freed_without_the_collector(lambda: TaskFilterForm(data, user=ada))
    assert freed_without_the_collector(lambda: InboxFilterForm(data, user=ada))
    assert isinstance(TaskFilterForm.base_fields["server"], ServerFilterField)
    # Django's form and model choice field, the same way: held by their own cycles until a collection.
    assert not freed_without_the_collector(lambda: DjangosForm(data))
