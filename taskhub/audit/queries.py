"""Filters → queryset: the one function behind the audit page, the CSV/JSON export and the JSON API.

`filtered_events(params)` takes the GET parameters and returns the bound form and the events it selects,
newest first. Invalid filters select nothing (the form carries the messages), so a typo never widens an
export to the whole trail. The (task, time), (server, time) and (time) indexes of AuditEvent.Meta serve the
task, server and time-range filters and the ordering.
"""

from collections.abc import Mapping

from django.db.models import Q, QuerySet, TextField
from django.db.models.fields.json import KT
from django.db.models.functions import Cast

from taskhub.audit.events import AUDIT_EVENTS
from taskhub.audit.forms import ANY_AGENT, EVERYONE, NO_AGENT, SYSTEM, AuditFilterForm
from taskhub.audit.models import AuditEvent

NEWEST_FIRST = ("-time", "-id")


def filtered_events(params: Mapping[str, str]) -> tuple[AuditFilterForm, QuerySet[AuditEvent]]:
    form = AuditFilterForm(params)
    if not form.is_valid():
        return form, AuditEvent.objects.none()
    return form, events_matching(form.cleaned_data)


def events_matching(filters: Mapping) -> QuerySet[AuditEvent]:
    events = AuditEvent.objects.all()
    made_by = filters.get("made_by") or EVERYONE  # the form says PEOPLE when the page is asked for nothing
    if made_by != EVERYONE:  # PEOPLE: with the partial index audit_people_time
        events = events.filter(actor__isnull=made_by == SYSTEM)
    if actor := filters.get("actor"):
        events = (
            events.filter(actor_label=actor)
            if filters.get("actor_exact")
            else events.filter(actor_label__icontains=actor)
        )
    if agent := filters.get("agent"):
        # With the has_key condition of the partial indexes audit_agent_time and audit_any_agent_time.
        through_one = Q(data__has_key="agent")
        events = events.exclude(through_one) if agent == NO_AGENT else events.filter(through_one)
        if agent not in (ANY_AGENT, NO_AGENT):
            events = events.alias(agent_token=KT("data__agent__token_id")).filter(agent_token=agent)
    if action := filters.get("action"):
        events = events.filter(action=action)
    if server := filters.get("server"):
        events = events.filter(server_id=server.pk)
    if task := filters.get("task"):
        events = events.filter(task_id=task)
    if since := filters.get("since"):
        events = events.filter(time__gte=since)
    if until := filters.get("until"):
        events = events.filter(time__lte=until)
    if text := filters.get("q"):
        described = [code for code, description in AUDIT_EVENTS.items() if text.lower() in description.lower()]
        events = events.annotate(data_text=Cast("data", output_field=TextField())).filter(
            Q(actor_label__icontains=text)
            | Q(action__icontains=text)
            | Q(action__in=described)
            | Q(data_text__icontains=text)
        )
    return events.order_by(*NEWEST_FIRST)
