"""What the API sends and accepts. Everything a server sent is passed on as data, never interpreted."""

import datetime
import uuid
from typing import Any, Literal

from ninja import Schema
from pydantic import Field


class Problem(Schema):
    error: str = Field(description="what went wrong, for a person")
    fields: dict[str, str] = Field(default_factory=dict, description="per argument or content field, what is wrong")


class InputRequestOut(Schema):
    id: int
    task_id: uuid.UUID
    key: str
    method: str
    mode: str | None
    state: str
    params: Any = Field(description="as the server sent it")
    answer: Any = None
    answered_by: str | None = None
    answered_at: datetime.datetime | None = None
    delivered_at: datetime.datetime | None = None
    created_at: datetime.datetime
    accepted_by: list[str] = Field(default_factory=list, description="N of M: who accepted so far")
    answer_comment: str = ""


class LaunchedVia(Schema):
    token_id: int | None = Field(description="the token's id; null once the token is deleted")
    label: str = Field(description="the token's name and prefix when it launched the task")


class TaskOut(Schema):
    id: uuid.UUID
    server: str
    server_id: int
    tool: str
    status: str
    outcome: str = Field(
        "", description="how it ended, as the task list's outcome filter says it (empty while it runs)"
    )
    status_message: str
    launched_by: str | None
    launched_via: LaunchedVia | None = Field(None, description="the API token (agent) it was launched with, if any")
    remote_task_id: str | None
    created_at: datetime.datetime
    updated_at: datetime.datetime
    finished_at: datetime.datetime | None
    cancel_requested_at: datetime.datetime | None
    launch_attempts: int = Field(
        0, description="while launching: how many attempts could not reach the server (of 9); 0 once it launched"
    )
    launch_last_error: str = Field("", description="why the last of those attempts failed (capped)")
    launch_next_try_at: datetime.datetime | None = Field(None, description="when the launch tries again")
    url: str


class TaskDetailOut(TaskOut):
    arguments: Any
    result: Any = Field(None, description="the CallToolResult, as the server sent it")
    error: Any = None
    ttl_ms: int | None
    poll_interval_ms: int | None
    input_requests: list[InputRequestOut]


class TaskPage(Schema):
    count: int
    page: int
    pages: int
    results: list[TaskOut]


class GroupedServer(Schema):
    server: str
    server_id: int
    count: int = Field(description="its open requests, left out of `results`; ask with server=<server_id>")


class InboxPage(Schema):
    count: int = Field(description="the requests in `results` over all pages")
    page: int
    pages: int
    results: list[InputRequestOut]
    grouped: list[GroupedServer] = Field(description="servers with more than 20 open requests, grouped")
    hidden_disabled: int = Field(description="open requests of disabled servers left out (disabled=false)")


class LaunchIn(Schema):
    server: str = Field(description="the server's name, or its numeric id")
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class AnswerIn(Schema):
    action: Literal["accept", "decline", "cancel"]
    content: dict[str, Any] | None = Field(None, description="the form's fields, for accept")
    comment: str = Field("", description="why (a decline's reason); required to decline where the policy says so")
