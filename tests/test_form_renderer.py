"""taskhub's form renderer writes Django's select and input templates in Python: every widget it renders must come out
byte for byte as Django's own templates render it (taskhub/web/form_renderer.py)."""

import datetime

import pytest
from django import forms
from django.conf import settings
from django.forms.renderers import DjangoTemplates
from django.utils.translation import gettext_lazy, override

from taskhub.api.forms import TokenForm
from taskhub.approvals.forms import PolicyForm, WebhookForm
from taskhub.audit.forms import AuditFilterForm
from taskhub.servers.forms import ServerForm
from taskhub.servers.models import Server, Transport
from taskhub.tasks.inbox_listing import InboxFilterForm
from taskhub.tasks.queries import TaskFilterForm
from taskhub.web.form_renderer import FormRenderer
from tests.account_fixtures import make_user

DJANGOS = DjangoTemplates()


class TemplatesAsked(FormRenderer):
    """Ours, noting each template it still asks Django's engine for."""

    def __init__(self):
        self.asked = []

    def get_template(self, template_name):
        self.asked.append(template_name)
        return super().get_template(template_name)


OURS = TemplatesAsked()
HOSTILE = "<b>\"quoted\" & 'single'</b>"


def both_ways(form: forms.Form) -> None:
    """Each field of `form` rendered by Django's templates and by ours: the same bytes."""
    for name in form.fields:
        form.renderer = DJANGOS
        djangos = str(form[name])
        form.renderer = OURS
        assert str(form[name]) == djangos, name


def test_the_setting_names_this_renderer():
    assert settings.FORM_RENDERER == "taskhub.web.form_renderer.FormRenderer"


class EveryWidget(forms.Form):
    text = forms.CharField(max_length=20, help_text="help", widget=forms.TextInput(attrs={"placeholder": HOSTILE}))
    number = forms.IntegerField(required=False, min_value=1)
    decimal = forms.DecimalField(required=False)
    email = forms.EmailField(required=False)
    url = forms.URLField(required=False)
    day = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    moment = forms.DateTimeField(required=False)
    clock = forms.TimeField(required=False)
    secret = forms.CharField(required=False, widget=forms.PasswordInput(render_value=True))
    hidden = forms.CharField(required=False, widget=forms.HiddenInput)
    search = forms.CharField(required=False, widget=forms.SearchInput)
    tick = forms.BooleanField(required=False)
    flag = forms.BooleanField(required=False, widget=forms.CheckboxInput(attrs={"data-on": True, "data-off": False}))
    choice = forms.ChoiceField(choices=[("", "—"), ("a", HOSTILE), ("b", gettext_lazy("Status")), (3, "three")])
    grouped = forms.ChoiceField(
        required=False, choices=[("", "any"), (HOSTILE, [("x", "ex"), ("y", "why")]), ("Second", [("z", "zed")])]
    )
    numbered = forms.ChoiceField(required=False, choices=[(1, 1), (2, 2.5)])  # labels that are not text
    many = forms.MultipleChoiceField(required=False, choices=[("a", "A"), ("b", "B")])
    radio = forms.ChoiceField(required=False, choices=[("a", "A"), ("b", "B")], widget=forms.RadioSelect)
    boxes = forms.MultipleChoiceField(
        required=False, choices=[("a", "A"), ("b", "B")], widget=forms.CheckboxSelectMultiple
    )
    words = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}))


@pytest.mark.parametrize(
    "data",
    [
        None,
        {},
        {
            "text": HOSTILE,
            "number": "7",
            "decimal": "1.5",
            "email": "not an email",
            "url": "http://x.example/?a=1&b=2",
            "day": "2026-12-05",
            "moment": "2026-12-05 10:00",
            "clock": "10:00",
            "secret": HOSTILE,
            "hidden": HOSTILE,
            "search": "q",
            "tick": "on",
            "flag": "on",
            "choice": "b",
            "grouped": "y",
            "numbered": "2",
            "many": ["a", "b"],
            "radio": "b",
            "boxes": ["b"],
            "words": HOSTILE,
        },
        {"choice": "nope", "grouped": HOSTILE, "number": "x", "day": "yesterday"},
    ],
    ids=["unbound", "empty", "filled", "invalid"],
)
def test_every_kind_of_widget_comes_out_as_djangos_templates_render_it(data):
    form = EveryWidget(data, initial={"day": datetime.date(2026, 1, 2), "choice": 3, "number": 4})
    form.is_bound and form.is_valid()
    both_ways(form)
    with override("zh-hans"):
        both_ways(EveryWidget(data))


@pytest.mark.django_db
def test_taskhubs_forms_come_out_as_djangos_templates_render_them():
    admin = make_user("ada", "admins", "operators", "approvers", is_staff=True)
    Server.objects.create(name=HOSTILE, transport=Transport.HTTP, url="http://a.example/mcp")
    Server.objects.create(name="beta", transport=Transport.HTTP, url="http://b.example/mcp")
    server = Server.objects.order_by("pk").first()
    filled = {"server": str(server.pk), "status": "working", "q": HOSTILE, "since": "2026-12-01", "mine": "on"}
    for data in (None, filled, {"server": "999", "since": "no", "outcome": HOSTILE}):
        task_filters = TaskFilterForm(data, user=admin)
        task_filters.is_bound and task_filters.is_valid()
        OURS.asked.clear()
        both_ways(task_filters)
        assert OURS.asked == [], "the task list's filter bar is rendered without a template"
        inbox_filters = InboxFilterForm(data, user=admin)
        inbox_filters.is_bound and inbox_filters.is_valid()
        both_ways(inbox_filters)
    for form in (AuditFilterForm({"server": str(server.pk)}), ServerForm(), TokenForm(), PolicyForm(), WebhookForm()):
        form.is_bound and form.is_valid()
        both_ways(form)
