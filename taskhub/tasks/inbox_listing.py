"""Which open requests the inbox shows (the page and GET /api/inbox): filtered, a page at a time, floods grouped.

A server with more than FLOOD_THRESHOLD open requests is a flood: unless the inbox is filtered to that server, its
requests are left out of the list and summed up in one line per server ("4,000 from X · show them"), so the few
requests of the other servers stay on the first page. When one server holds every visible request nothing is
buried and its requests are listed as usual. Requests of disabled servers are hidden unless asked for.
"""

import math
from dataclasses import dataclass, field
from urllib.parse import urlencode

from django import forms
from django.db.models import Count, QuerySet
from django.utils.translation import gettext_lazy

from taskhub.accounts import permissions
from taskhub.acyclic_forms import AcyclicForm
from taskhub.servers.forms import ServerFilterField
from taskhub.servers.models import Server
from taskhub.tasks.card_requests import requests_for_cards
from taskhub.tasks.models import InputRequest
from taskhub.tasks.queries import filter_errors
from taskhub.tasks.waiting import waiting_for

PAGE_SIZE = 50
FLOOD_THRESHOLD = 20
FILTER_NAMES = ("server", "tool", "mine", "disabled")


class InboxFilterForm(AcyclicForm):
    server = ServerFilterField(
        required=False,
        queryset=Server.objects.none(),
        empty_label=gettext_lazy("any server"),
        error_messages={"invalid_choice": gettext_lazy("There is no server with that id among those you approve for.")},
    )
    tool = forms.CharField(required=False, max_length=200)
    mine = forms.BooleanField(
        required=False,
        label=gettext_lazy("For me"),
        help_text=gettext_lazy("requests whose policy names me or my group"),
    )
    disabled = forms.BooleanField(required=False, label=gettext_lazy("Show disabled servers' requests"))
    page = forms.IntegerField(
        required=False, min_value=1, error_messages={"invalid": "The page must be a whole number (1, 2, …)."}
    )

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["server"].queryset = permissions.servers_user_may_approve(user).order_by("name")
        self.fields["tool"].widget.attrs["autocomplete"] = "off"
        self.fields["page"].error_messages["min_value"] = "Pages are numbered from 1."


@dataclass
class Flood:
    server: Server
    count: int
    href: str = ""


@dataclass
class InboxListing:
    requests: list[InputRequest]
    count: int  # the requests listed over all pages (a flood's requests are not listed, they are in `floods`)
    page: int
    pages: int
    page_size: int
    server: Server | None
    tool: str
    show_disabled: bool
    mine: bool = False
    floods: list[Flood] = field(default_factory=list)
    hidden_disabled: int = 0  # open requests of disabled servers left out (0 when they are shown)
    errors: dict[str, str] = field(default_factory=dict)
    form: InboxFilterForm | None = None

    @property
    def filtered(self) -> bool:
        return bool(self.server or self.tool or self.show_disabled or self.mine)

    @property
    def waiting(self) -> int | None:
        """All the requests waiting for the user (tasks/waiting.py) when this listing counted them, unfiltered: the
        listed and the floods'. The nav's Inbox badge is this count, not counted again."""
        return None if self.filtered else self.count + sum(flood.count for flood in self.floods)

    @property
    def more(self) -> int:
        """Requests on the pages after this one."""
        return max(0, self.count - (self.page - 1) * self.page_size - len(self.requests))

    def query(self, **changes) -> str:
        """This listing's filters (and page) as a query string, with `changes` (None drops a parameter)."""
        values = {
            "server": self.server.pk if self.server else None,
            "tool": self.tool or None,
            "mine": "1" if self.mine else None,
            "disabled": "1" if self.show_disabled else None,
            "page": self.page if self.page > 1 else None,
        }
        values.update(changes)
        if values["page"] == 1:
            values["page"] = None
        kept = {name: value for name, value in values.items() if value not in (None, "")}
        return f"?{urlencode(kept)}" if kept else ""


def inbox_listing(user, params, *, page_size: int = PAGE_SIZE) -> InboxListing:
    """The open requests `user` may answer that `params` (a QueryDict) asks for. Values that do not fit are in
    `errors` and left out of the filter; a page past the last shows the last."""
    form = InboxFilterForm(params, user=user)
    errors = filter_errors(form)
    data = form.cleaned_data
    server, tool, show_disabled = data.get("server"), (data.get("tool") or "").strip(), bool(data.get("disabled"))

    # The few servers by id, not joined: 100,000 open requests are then read from their server index alone.
    approvable = permissions.approvable_servers(user)
    # "Waiting for me" (tasks/waiting.py), disabled servers' requests counted apart.
    waiting: QuerySet[InputRequest] = waiting_for(user, server_ids=list(approvable))
    hidden_disabled = 0
    if not show_disabled:
        hidden_disabled = waiting.filter(server__in=[pk for pk, enabled in approvable.items() if not enabled]).count()
        waiting = waiting.filter(server__in=[pk for pk, enabled in approvable.items() if enabled])
    if server is not None:
        waiting = waiting.filter(server=server)
    if tool:
        waiting = waiting.filter(task__tool=tool)
    mine = bool(data.get("mine"))
    if mine:
        waiting = waiting.filter(permissions.requests_for_me(user))

    floods: list[Flood] = []
    if server is None:
        # COUNT(*): the (server) INCLUDE (escalated_to) index of the open requests answers alone; the id is not in it.
        per_server = dict(waiting.order_by().values_list("server").annotate(n=Count("*")))
        flooding = {pk: n for pk, n in per_server.items() if n > FLOOD_THRESHOLD}
        if flooding and len(per_server) > 1:
            names = Server.objects.in_bulk(list(flooding))
            floods = [Flood(names[pk], n) for pk, n in flooding.items()]
            floods.sort(key=lambda flood: (-flood.count, flood.server.name))
            # The servers left, named (not "all but the floods"): the open requests' server index finds their few
            # requests without walking the floods' many; none left, no query at all.
            waiting = waiting.filter(server__in=[pk for pk in per_server if pk not in flooding])
            per_server = {pk: n for pk, n in per_server.items() if pk not in flooding}
        count = sum(per_server.values())  # the listed requests, counted once already
    else:
        count = waiting.count()
    pages = max(1, math.ceil(count / page_size))
    page = data.get("page") or 1
    if page > pages:
        errors["page"] = f"There is no page {page}: {_pages(pages)} of requests match."
        page = pages
    start = (page - 1) * page_size
    requests = requests_for_cards(
        list(waiting.order_by("created_at", "pk").values_list("pk", flat=True)[start : start + page_size])
    )
    listing = InboxListing(
        requests=requests,
        count=count,
        page=page,
        pages=pages,
        page_size=page_size,
        server=server,
        tool=tool,
        show_disabled=show_disabled,
        mine=mine,
        floods=floods,
        hidden_disabled=hidden_disabled,
        errors=errors,
        form=form,
    )
    for flood in floods:
        flood.href = listing.query(server=flood.server.pk, page=None)
    return listing


def _pages(pages: int) -> str:
    return "one page" if pages == 1 else f"{pages} pages"
