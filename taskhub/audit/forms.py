"""The audit filter form: one GET form for the page, both exports and (later) the JSON API."""

import datetime
import uuid
from collections import defaultdict

from django import apps, forms
from django.db.models import F
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from taskhub.acyclic_forms import AcyclicForm
from taskhub.audit.events import AUDIT_EVENTS
from taskhub.audit.models import agent_label
from taskhub.servers.forms import ServerChoiceField
from taskhub.servers.models import Server

GROUP_NAMES = {
    "server": _("Servers"),
    "task": _("Tasks"),
    "input": _("Input requests"),
    "api_token": _("API tokens"),
    "audit": _("Audit trail"),
}


def action_choices() -> list:
    """The registry as a select: grouped by the part before the dot, each option saying what it means."""
    groups: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for code, description in AUDIT_EVENTS.items():
        groups[code.split(".", 1)[0]].append((code, f"{gettext(description)} ({code})"))
    return [("", gettext("any action"))] + [
        (GROUP_NAMES.get(prefix, prefix), options) for prefix, options in groups.items()
    ]


ANY_AGENT = "any"
NO_AGENT = "none"


def agent_choices() -> list[tuple[str, str]]:
    """Every API token (the audit page is for admins), by the model's label: the audit readers never import the API."""
    tokens = apps.apps.get_model("api", "ApiToken").objects.select_related("user").order_by("revoked_at", "name", "pk")
    return [
        ("", gettext("people and agents")),
        (ANY_AGENT, gettext("done through an agent")),
        (NO_AGENT, gettext("done without one")),
        *(
            (
                str(token.pk),
                agent_label({"name": token.name, "prefix": token.prefix})
                + f" · {token.user.get_username()}"
                + (" · " + gettext("revoked") if token.revoked_at else ""),
            )
            for token in tokens
        ),
    ]


def parse_utc(text: str, *, end_of_day: bool) -> datetime.datetime:
    """A date (YYYY-MM-DD) or a datetime-local value (YYYY-MM-DDTHH:MM[:SS]), read as UTC.

    Both ends of a range are inclusive; a bare date as its end means the whole of that day (its last
    microsecond), so "to 2026-11-29" includes 23:59:59.
    """
    text = text.strip()
    try:
        if len(text) == 10:
            day = datetime.date.fromisoformat(text)
            moment = datetime.datetime.combine(day, datetime.time.min, tzinfo=datetime.UTC)
            return moment + datetime.timedelta(days=1, microseconds=-1) if end_of_day else moment
        moment = datetime.datetime.fromisoformat(text.replace(" ", "T", 1))
    except ValueError:
        raise forms.ValidationError(
            _("“%(value)s” is not a date or time. Use YYYY-MM-DD or YYYY-MM-DDTHH:MM (UTC)."),
            code="invalid",
            params={"value": text[:40]},
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment


class UTCMomentField(forms.CharField):
    """Keeps what the user typed (so the form shows it back); `clean` gives an aware datetime."""

    def __init__(self, *, end_of_day: bool = False, **kwargs) -> None:
        self.end_of_day = end_of_day
        kwargs.setdefault("widget", forms.DateTimeInput(attrs={"type": "datetime-local", "step": "1"}))
        super().__init__(required=False, max_length=40, **kwargs)

    def clean(self, value):
        text = super().clean(value)
        return parse_utc(text, end_of_day=self.end_of_day) if text else None


PEOPLE, SYSTEM, EVERYONE = "people", "system", "all"
MADE_BY = (
    (PEOPLE, _("people's actions")),
    (SYSTEM, _("taskhub's own (system, worker)")),
    (EVERYONE, _("everything")),
)


class AuditFilterForm(AcyclicForm):
    # People's actions unless asked otherwise: what a person decided is what the page is read for; the worker's
    # own records (status changes, deliveries, retries) are one click away.
    made_by = forms.ChoiceField(required=False, label=_("Made by"), choices=MADE_BY)
    actor = forms.CharField(
        required=False,
        max_length=150,
        label=_("Actor"),
        widget=forms.TextInput(attrs={"placeholder": _("alice, system, worker…"), "autocomplete": "off"}),
    )
    actor_exact = forms.BooleanField(required=False, label=_("exact name"))
    agent = forms.ChoiceField(
        required=False,
        label=_("Agent (API token)"),
        choices=agent_choices,
        error_messages={"invalid_choice": _("There is no API token “%(value)s”. Choose one from the list.")},
    )
    action = forms.ChoiceField(
        required=False,
        label=_("Action"),
        choices=action_choices,
        error_messages={
            "invalid_choice": _("“%(value)s” is not an audit action taskhub records. Choose one from the list.")
        },
    )
    server = ServerChoiceField(  # removed servers too: their history stays readable, named "(removed)"
        required=False,
        label=_("Server"),
        queryset=Server.objects.order_by("name", F("removed_at").desc(nulls_first=True)),
        empty_label=_("any server"),
        error_messages={"invalid_choice": _("That server does not exist (any more). Choose one from the list.")},
    )
    task = forms.CharField(
        required=False,
        max_length=80,
        label=_("Task id"),
        widget=forms.TextInput(attrs={"placeholder": _("full task id"), "autocomplete": "off", "spellcheck": "false"}),
    )
    since = UTCMomentField(label=_("From (UTC)"))
    until = UTCMomentField(label=_("To (UTC)"), end_of_day=True)
    q = forms.CharField(
        required=False,
        max_length=200,
        label=_("Search"),
        help_text=_("actor, action and event details"),
        widget=forms.TextInput(attrs={"type": "search", "placeholder": _("text in the event"), "autocomplete": "off"}),
    )

    def clean_made_by(self) -> str:
        return self.cleaned_data["made_by"] or PEOPLE

    def clean_task(self) -> uuid.UUID | None:
        text = self.cleaned_data["task"].strip()
        if not text:
            return None
        try:
            return uuid.UUID(text)
        except ValueError:
            raise forms.ValidationError(
                _("“%(value)s” is not a task id. Paste the whole id (the copy button next to a task id gives it)."),
                code="invalid",
                params={"value": text[:40]},
            ) from None

    def clean(self):
        cleaned = super().clean()
        since, until = cleaned.get("since"), cleaned.get("until")
        if since and until and since > until:
            self.add_error("until", _("“To” is before “From”: swap them, or clear one."))
        return cleaned

    def active_filters(self) -> dict[str, str]:
        """The filters in use, as text: what an export records about itself."""
        if not self.is_valid():
            return {}
        shown = {}
        for name, value in self.cleaned_data.items():
            if value in (None, "", False) or (name == "actor_exact" and not self.cleaned_data.get("actor")):
                continue
            if isinstance(value, datetime.datetime):
                value = value.isoformat()
            elif isinstance(value, Server):
                value = f"{value.pk} ({value.name})"
            shown[name] = value if isinstance(value, bool) else str(value)
        return shown
