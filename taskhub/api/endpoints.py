"""The JSON API: the same services, permissions and audit trail as the pages; the actor is the token's user.

Errors are `{"error": "...", "fields": {...}}` with a 4xx status, and change nothing.
"""

import logging
import math
import uuid

from django.core.exceptions import PermissionDenied
from django.db import DataError, InterfaceError, OperationalError, transaction
from django.db.models import F, Q
from django.http import Http404, QueryDict
from django.urls import reverse
from ninja import Field, NinjaAPI, Query, Schema
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.responses import Status

from taskhub.accounts import permissions
from taskhub.api.auth import ApiTokenAuth, signed_in_or_token
from taskhub.api.schemas import (
    AnswerIn,
    InboxPage,
    InputRequestOut,
    LaunchIn,
    Problem,
    TaskDetailOut,
    TaskOut,
    TaskPage,
)
from taskhub.gateway.sending import answer_and_send
from taskhub.servers.models import Server
from taskhub.tasks import services
from taskhub.tasks.errors import (
    AlreadyAnswered,
    AnswerRejected,
    InputNoLongerOpen,
    InvalidTransition,
    LaunchRefused,
    TaskError,
    UnknownTool,
)
from taskhub.tasks.inbox_listing import inbox_listing
from taskhub.tasks.input_cards import card_for
from taskhub.tasks.models import InputRequest, Task
from taskhub.tasks.outcomes import OUTCOME_WORDS, outcome_of, settle_outcomes, with_row_facts
from taskhub.tasks.queries import ENDED_CHOICES, NEEDS, TAB_STATUSES, TaskFilterForm, filtered_tasks

logger = logging.getLogger(__name__)

PAGE_SIZE_MAX = 200

api = NinjaAPI(
    title="taskhub API",
    version="1",
    description="Launch MCP tool calls, follow their tasks, answer their input requests, cancel them. "
    "Authenticate with `Authorization: Bearer <token>` (`manage.py create_api_token USER`).",
    auth=ApiTokenAuth(),
    urls_namespace="api",
    docs_url="/docs",
    docs_decorator=signed_in_or_token,
)


class ApiProblem(Exception):
    def __init__(self, status: int, error: str, fields: dict[str, str] | None = None):
        self.status, self.error, self.fields = status, error, fields or {}


def _problem(request, status: int, error: str, fields: dict[str, str] | None = None):
    return api.create_response(request, {"error": error, "fields": fields or {}}, status=status)


@api.exception_handler(ApiProblem)
def on_problem(request, exc: ApiProblem):
    return _problem(request, exc.status, exc.error, exc.fields)


@api.exception_handler(ValidationError)
def on_invalid(request, exc: ValidationError):
    fields = {}
    for error in exc.errors:
        location = [str(part) for part in error.get("loc", ()) if part not in ("body", "payload", "query")]
        fields[".".join(location) or "body"] = str(error.get("msg", "invalid"))
    return _problem(request, 400, "The request does not have the expected shape.", fields)


@api.exception_handler(AuthenticationError)
def on_unauthenticated(request, exc):
    return _problem(request, 401, "Send a valid API token: Authorization: Bearer <token>.")


@api.exception_handler(PermissionDenied)
def on_forbidden(request, exc):
    return _problem(request, 403, str(exc) or "Your role does not allow this.")


@api.exception_handler(Http404)
def on_not_found(request, exc):
    return _problem(request, 404, str(exc) or "Not found.")


@api.exception_handler(HttpError)
def on_http_error(request, exc: HttpError):
    # Ninja raises this for a body that is not JSON at all.
    return _problem(request, exc.status_code, str(exc))


# Every error of the API is JSON, never Django's HTML error page (ninja's default re-raises without DEBUG).
@api.exception_handler(Exception)
def on_unexpected(request, exc: Exception):
    if isinstance(exc, (OperationalError, InterfaceError)):
        logger.warning("API request failed: the database cannot be reached: %s", exc)
        response = _problem(request, 503, "The database cannot be reached; try again in a moment.")
        response["Retry-After"] = "10"
        return response
    if isinstance(exc, DataError):
        logger.warning("API request refused by the database: %s", exc)
        return _problem(request, 400, "The request contains a value the database cannot store.")
    logger.error("API request failed", exc_info=exc)
    return _problem(request, 500, "Something went wrong on the server; it has been logged.")


# --- helpers --------------------------------------------------------------------------------------


def _task_out(task: Task) -> dict:
    return {
        "id": task.id,
        "server": task.server.name,
        "server_id": task.server_id,
        "tool": task.tool,
        "status": task.status,
        "outcome": task.outcome if hasattr(task, "outcome") else outcome_of(task),
        "status_message": task.status_message,
        "launched_by": task.launched_by.get_username() if task.launched_by else None,
        "launched_via": (
            {"token_id": task.launched_via_token_id, "label": task.launched_via_label}
            if task.launched_by_agent
            else None
        ),
        "remote_task_id": task.remote_task_id,
        "created_at": task.created_at,
        "updated_at": task.updated_at,
        "finished_at": task.finished_at,
        "cancel_requested_at": task.cancel_requested_at,
        "launch_attempts": task.launch_attempts,
        "launch_last_error": task.launch_last_error,
        "launch_next_try_at": task.launch_next_try_at,
        "url": reverse("tasks:detail", args=[task.id]),
    }


def _request_out(input_request: InputRequest) -> dict:
    return {
        "id": input_request.pk,
        "task_id": input_request.task_id,
        "key": input_request.key,
        "method": input_request.method,
        "mode": input_request.mode,
        "state": input_request.state,
        "params": input_request.params,
        "answer": input_request.answer,
        "answered_by": input_request.answered_by.get_username() if input_request.answered_by else None,
        "answered_at": input_request.answered_at,
        "delivered_at": input_request.delivered_at,
        "created_at": input_request.created_at,
        "accepted_by": [
            str(entry.get("name", "")) for entry in input_request.acceptances or [] if isinstance(entry, dict)
        ],
        "answer_comment": input_request.answer_comment,
    }


def _task_detail_out(task: Task) -> dict:
    requests = task.input_requests.select_related("answered_by").order_by("created_at", "pk")
    return {
        **_task_out(task),
        "arguments": task.arguments,
        "result": task.result,
        "error": task.error,
        "ttl_ms": task.ttl_ms,
        "poll_interval_ms": task.poll_interval_ms,
        "input_requests": [_request_out(ir) for ir in requests],
    }


def _visible_task(user, task_id: uuid.UUID) -> Task:
    task = Task.objects.select_related("server", "launched_by").filter(pk=task_id).first()
    if task is None or not permissions.may_see_task_through_token(user, task):
        raise Http404("No such task.")  # a task one may not see does not exist for them
    return task


def _server_named(user, name_or_id: str) -> Server:
    lookup = Q(name=name_or_id) | (Q(pk=int(name_or_id)) if name_or_id.isdigit() else Q(pk__in=[]))
    server = Server.objects.filter(lookup).order_by(F("removed_at").desc(nulls_first=True)).first()
    if server is None:
        raise ApiProblem(404, f"No server {name_or_id!r}.", {"server": "unknown server"})
    return server


# --- tasks ----------------------------------------------------------------------------------------


class TaskFilters(Schema):
    status: str = Field("", description="a status tab (running, completed, failed, …) or one status")
    server: str = Field("", description="only this server's tasks: its name or numeric id")
    tool: str = Field("", description="part of the tool's name, any case")
    launched_by: str = Field("", description="the username of who launched it")
    agent: str = Field(
        "",
        description="`any`: launched by an agent (an API token); `none`: by a person; or one token's id (yours, "
        "or anyone's for admins)",
    )
    mine: bool = Field(False, description="only the tasks you launched")
    q: str = Field(
        "",
        description=(
            "search, any case, in every field at once: the status message, the tool, the server's task id, the"
            " arguments and the result (as JSON text), and our task id (4 or more hex digits: a prefix is enough)"
        ),
    )
    outcome: str = Field("", description=f"how it ended: {', '.join(str(value) for value in OUTCOME_WORDS)}")
    needs: str = Field("", description=f"needing attention: {', '.join(str(value) for value, _ in NEEDS)}")
    ended: str = Field("", description=f"ended within: {', '.join(value for value, _ in ENDED_CHOICES if value)}")
    since: str = Field("", description="created on or after this day (YYYY-MM-DD, UTC)")
    until: str = Field("", description="created on or before this day (YYYY-MM-DD, UTC)")
    page: int = Field(1, description="1, 2, …")
    page_size: int = Field(50, description=f"tasks per page, at most {PAGE_SIZE_MAX}")


@api.get("/tasks", response={200: TaskPage, 400: Problem, 401: Problem, 403: Problem}, tags=["tasks"])
def list_tasks(request, filters: Query[TaskFilters]):
    """The tasks you may see, newest first, with the task list page's filters (an agent: the tasks it launched)."""
    roles = permissions.roles_of(request.user)
    if not (roles.operator or roles.approver or roles.agent):
        raise PermissionDenied("The task list is for operators, admins, approvers and agents.")
    params = filters.dict()
    if params["server"] and not params["server"].isdigit():
        server = Server.named(params["server"])
        params["server"] = str(server.pk) if server else "-1"
    form = TaskFilterForm(
        {k: v for k, v in params.items() if k not in ("page", "page_size")}, user=request.user, through_token=True
    )
    if not form.is_valid():
        raise ApiProblem(400, "Some filters are not valid.", {name: " ".join(e) for name, e in form.errors.items()})
    tasks, status = filtered_tasks(form, request.user, through_token=True)
    if status:
        tasks = tasks.filter(status__in=TAB_STATUSES[status])
    page_size = max(1, min(filters.page_size, PAGE_SIZE_MAX))
    count = tasks.count()
    pages = max(1, math.ceil(count / page_size))
    page = max(1, min(filters.page, pages))
    rows = with_row_facts(tasks.select_related("server", "launched_by")).order_by("-created_at")[
        (page - 1) * page_size : page * page_size
    ]
    rows = settle_outcomes(list(rows))
    return {"count": count, "page": page, "pages": pages, "results": [_task_out(task) for task in rows]}


@api.get("/tasks/{task_id}", response={200: TaskDetailOut, 401: Problem, 404: Problem}, tags=["tasks"])
def get_task(request, task_id: uuid.UUID):
    """One task: status, result or error, arguments and every input request."""
    return _task_detail_out(_visible_task(request.user, task_id))


@api.post(
    "/tasks",
    response={201: TaskDetailOut, 400: Problem, 401: Problem, 403: Problem, 404: Problem, 409: Problem},
    tags=["tasks"],
)
def launch_task(request, payload: LaunchIn):
    """Launch a tool call; its arguments are checked against the tool's input schema first. The task records the
    token it was launched with (the agent)."""
    if not permissions.launches_through_token(request.user):
        raise PermissionDenied("Launching tools is for operators and agents.")
    server = _server_named(request.user, payload.server)
    if not permissions.may_launch_through_token(request.user, server):
        raise ApiProblem(409, f"The server {server.name} is disabled: tools cannot be launched on it.")
    try:
        task = services.launch(
            server=server,
            tool=payload.tool,
            arguments=payload.arguments,
            user=request.user,
            token=request.api_token,
        )
    except UnknownTool as unknown:
        raise ApiProblem(404, str(unknown)) from unknown
    except LaunchRefused as refused:
        raise ApiProblem(400, str(refused), refused.field_errors) from refused
    except TaskError as error:
        raise ApiProblem(409, str(error)) from error
    return Status(201, _task_detail_out(_visible_task(request.user, task.id)))


@api.post(
    "/tasks/{task_id}/cancel",
    response={202: TaskOut, 401: Problem, 403: Problem, 404: Problem, 409: Problem},
    tags=["tasks"],
)
def cancel_task(request, task_id: uuid.UUID):
    """Ask the server to cancel (tasks/cancel). The task may still end otherwise; follow it to see."""
    task = _visible_task(request.user, task_id)
    if not permissions.may_cancel(request.user, task):
        raise PermissionDenied("Cancelling tasks is for operators, and agents for the tasks they launched.")
    try:
        services.request_cancel(task=task, user=request.user, token=request.api_token)
    except InvalidTransition as error:
        raise ApiProblem(409, str(error)) from error
    return Status(202, _task_out(_visible_task(request.user, task_id)))


# --- input requests -------------------------------------------------------------------------------


class InboxFilters(Schema):
    server: str = Field("", description="only this server's requests: its name or numeric id")
    tool: str = Field("", description="only requests of tasks of this tool")
    disabled: bool = Field(False, description="include requests of disabled servers (hidden by default)")
    mine: bool = Field(False, description="only requests whose approval policy names you or a group of yours")
    page: int = Field(1, description="1, 2, …; past the last page is an error")
    page_size: int = Field(50, description=f"requests per page, at most {PAGE_SIZE_MAX}")


@api.get("/inbox", response={200: InboxPage, 400: Problem, 401: Problem, 403: Problem}, tags=["input requests"])
def inbox(request, filters: Query[InboxFilters]):
    """The open input requests you may answer, oldest first, a page at a time (`page`, `page_size`).

    A server with more than 20 open requests is grouped when other servers have requests too: its requests are
    not in `results` but counted in `grouped` (ask for them with `server=`), so one server cannot bury the others.
    Requests of disabled servers are left out unless `disabled=true` (`hidden_disabled` counts them). A filter
    that does not fit (an unknown server, a page past the last) is a 400 that says which."""
    if not permissions.is_approver(request.user):
        raise PermissionDenied("The inbox is for approvers.")
    if not 1 <= filters.page_size <= PAGE_SIZE_MAX:
        raise ApiProblem(400, "Some filters are not valid.", {"page_size": f"Between 1 and {PAGE_SIZE_MAX}."})
    params = QueryDict(mutable=True)
    server = filters.server.strip()
    if server and not server.isdigit():
        mine = permissions.servers_user_may_approve(request.user).filter(name=server)
        named = mine.order_by(F("removed_at").desc(nulls_first=True)).first()  # the one in use, if any
        if named is None:
            raise ApiProblem(400, "Some filters are not valid.", {"server": f"You approve for no server {server!r}."})
        server = str(named.pk)
    params.update({"server": server, "tool": filters.tool, "page": str(filters.page)})
    if filters.disabled:
        params["disabled"] = "1"
    if filters.mine:
        params["mine"] = "1"
    listing = inbox_listing(request.user, params, page_size=filters.page_size)
    if listing.errors:
        raise ApiProblem(400, "Some filters are not valid.", listing.errors)
    return {
        "count": listing.count,
        "page": listing.page,
        "pages": listing.pages,
        "results": [_request_out(ir) for ir in listing.requests],
        "grouped": [
            {"server": flood.server.name, "server_id": flood.server.pk, "count": flood.count}
            for flood in listing.floods
        ],
        "hidden_disabled": listing.hidden_disabled,
    }


@api.post(
    "/input-requests/{request_id}/answer",
    response={200: InputRequestOut, 400: Problem, 401: Problem, 403: Problem, 404: Problem, 409: Problem},
    tags=["input requests"],
)
def answer(request, request_id: int, payload: AnswerIn):
    """Answer an elicitation: accept (with content for a form), decline or cancel. Each request takes one answer."""
    # As the inbox's answer view: the request read once, locked, for the checks and the answer, and the answer sent by
    # this process as it commits where it can (taskhub/gateway/sending.py), else by the delivery job. A refusal raised
    # in here rolls back a transaction that has changed nothing.
    with transaction.atomic():
        try:
            input_request = services.locked_for_answer(input_request_id=request_id)
        except InputRequest.DoesNotExist:
            raise Http404("No such input request.") from None
        if not permissions.may_see_task_through_token(request.user, input_request.task):
            raise Http404("No such input request.")
        if not permissions.may_answer(request.user, input_request):
            raise PermissionDenied(f"You do not approve for the server {input_request.task.server.name!r}.")
        card = card_for(input_request, request.user, may_answer=True)
        if card.kind == "other":
            raise ApiProblem(400, f"taskhub cannot answer {input_request.method or 'this kind of'} requests.")
        response = {"action": payload.action}
        if payload.action == "accept" and card.kind == "form":
            if not card.form.renderable:
                raise ApiProblem(400, "This request's schema cannot be answered by taskhub; decline or cancel it.")
            response["content"] = payload.content or {}
        elif payload.action == "accept" and card.kind == "url" and not card.url.clickable:
            raise ApiProblem(400, card.url.problem or "This URL cannot be opened from taskhub; decline or cancel.")
        try:
            answered = answer_and_send(
                input_request=input_request,
                response=response,
                user=request.user,
                comment=payload.comment,
                token=request.api_token,
            )
        except AnswerRejected as rejected:
            raise ApiProblem(400, str(rejected), rejected.field_errors) from rejected
        except (AlreadyAnswered, InputNoLongerOpen) as closed:
            raise ApiProblem(409, str(closed)) from closed
    return _request_out(InputRequest.objects.select_related("answered_by").get(pk=answered.pk))
