"""The audit pages (admins): the filtered list and its CSV / JSON export. Both use queries.filtered_events."""

import csv
import datetime
from collections.abc import AsyncIterator

from django.core.paginator import Paginator
from django.db import transaction
from django.http import Http404, HttpResponse, QueryDict, StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.functional import cached_property
from django.views.decorators.http import require_GET

from taskhub.accounts.permissions import admin_required
from taskhub.audit import chain
from taskhub.audit.exporting import export_line, export_row, with_data_text
from taskhub.audit.forms import MADE_BY, PEOPLE
from taskhub.audit.models import AuditEvent
from taskhub.audit.queries import filtered_events
from taskhub.audit.services import record_event
from taskhub.servers.models import Server

PAGE_SIZE = 100
EXPORT_FORMATS = ("csv", "json")
EXPORT_COLUMNS = (
    "id",
    "time",
    "actor_label",
    "actor_id",
    "action",
    "description",
    "task_id",
    "server_id",
    "seq",
    "prev_hash",
    "hash",
    "data",
)
EXPORT_CHUNK = 500
# A spreadsheet runs a cell starting with one of these as a formula (OWASP "CSV injection").
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


COUNT_CAP = 10_000  # counted at most this far: an exact count of millions of rows costs seconds


class CappedPaginator(Paginator):
    """Counts at most COUNT_CAP rows (`over_cap` says there are more): past that, filters narrow faster than pages."""

    @cached_property
    def count(self) -> int:
        counted = self.object_list.order_by()[: COUNT_CAP + 1].count()
        self.over_cap = counted > COUNT_CAP
        return min(counted, COUNT_CAP)


def made_by_links(params: QueryDict, form) -> list[dict]:
    """One link per "made by" choice, keeping the other filters: people's actions, taskhub's own, everything."""
    current = form.cleaned_data.get("made_by", PEOPLE) if form.is_valid() else params.get("made_by") or PEOPLE
    links = []
    for value, label in MADE_BY:
        kept = QueryDict(filter_query(params), mutable=True)
        kept["made_by"] = value
        links.append({"label": label, "query": kept.urlencode(), "current": value == current})
    return links


@require_GET
@admin_required
def audit_list(request):
    form, events = filtered_events(request.GET)
    paginator = CappedPaginator(events, PAGE_SIZE)
    page = paginator.get_page(request.GET.get("page"))
    server_ids = {event.server_id for event in page if event.server_id is not None}
    server_names = dict(Server.objects.filter(pk__in=server_ids).values_list("pk", "name"))
    for event in page:
        event.server_name = server_names.get(event.server_id)
    context = {
        "form": form,
        "page": page,
        "filters": filter_query(request.GET),
        "over_cap": getattr(paginator, "over_cap", False),
        "made_by": made_by_links(request.GET, form),
    }
    template = "audit/list.html#filtered" if request.htmx else "audit/list.html"
    return render(request, template, context)


@require_GET
@admin_required
def audit_verify(request):
    """Whether each month's hash chain is whole, else its first broken row (what `manage.py audit verify` says). It
    reads every row: seconds on millions of them."""
    months = chain.verify_all()
    context = {"months": months, "whole": all(month.whole for month in months)}
    return render(request, "audit/verify.html", context)


def filter_query(params: QueryDict) -> str:
    """The filters in use as a query string, for page and export links (empty fields and the page left out)."""
    kept = QueryDict(mutable=True)
    for name, values in params.lists():
        if name != "page" and (values := [value for value in values if value.strip()]):
            kept.setlist(name, values)
    return kept.urlencode()


@require_GET
@admin_required
def audit_export(request, fmt):
    if fmt not in EXPORT_FORMATS:
        raise Http404("The audit trail exports as .csv or .json.")
    form, events = filtered_events(request.GET)
    if not form.is_valid():
        errors = "\n".join(f"{field}: {' '.join(messages)}" for field, messages in form.errors.items())
        return HttpResponse(
            f"Nothing exported: the filters are not valid.\n{errors}\n",
            status=400,
            content_type="text/plain; charset=utf-8",
        )
    now = timezone.now()
    chain.seal_committed()  # the rows sent carry their place in the chain
    with transaction.atomic():
        # The rows that exist now, and no later ones: the count recorded below is exactly what is sent.
        newest = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0
        events = events.filter(id__lte=newest)
        rows = events.count()
        record_event(
            action="audit.exported",
            user=request.user,
            data={"format": fmt, "filters": form.active_filters(), "rows": rows, "up_to_event": newest},
        )
    filename = f"taskhub-audit-{now.astimezone(datetime.UTC):%Y%m%dT%H%M%SZ}.{fmt}"
    stream = csv_stream(events) if fmt == "csv" else json_stream(events)
    content_type = "text/csv; charset=utf-8" if fmt == "csv" else "application/json"
    response = StreamingHttpResponse(stream, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["X-Audit-Rows"] = str(rows)
    response["Cache-Control"] = "no-store"
    return response


def spreadsheet_safe(value):
    """A text cell a spreadsheet would run as a formula gets a leading apostrophe; numbers pass as they are."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return f"'{value}"
    return value


class _Line:
    """A file-like object for csv.writer that hands back the line it was given."""

    def write(self, text: str) -> str:
        return text


async def _rows(events) -> AsyncIterator[dict]:
    # Async, so that daphne streams row by row; a server-side cursor fetches EXPORT_CHUNK rows at a time.
    async for event in with_data_text(events).aiterator(chunk_size=EXPORT_CHUNK):
        yield export_row(event)


async def csv_stream(events) -> AsyncIterator[str]:
    writer = csv.writer(_Line())
    yield writer.writerow(EXPORT_COLUMNS)
    async for row in _rows(events):
        yield writer.writerow(["" if row[c] is None else spreadsheet_safe(row[c]) for c in EXPORT_COLUMNS])


async def json_stream(events) -> AsyncIterator[str]:
    """One JSON array, one event object per line: `json.load` reads it whole, and it streams."""
    yield "["
    separator = "\n"
    async for row in _rows(events):
        yield separator + export_line(row)
        separator = ",\n"
    yield "\n]\n"
