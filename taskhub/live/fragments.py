"""The HTML the live socket pushes: htmx out-of-band fragments (elements with an id and `hx-swap-oob`).

Pages register what they own, per kind of interest the connection has in a changed task:

    from taskhub.live.fragments import FragmentKind, register_task_fragment

    @register_task_fragment(FragmentKind.TASKS)
    def task_row(task, user) -> str:
        return render_to_string("tasks/list.html#task-row", {"task": task, "oob": True})

- TASKS: the user sees every task (operators, admins): list rows, status tab counts.
- TASK: the page watches this task ({"watch": "<uuid>"}): the detail header, its timeline.
- INBOX: the task belongs to a server the user approves for: inbox cards.

User fragments (`render(user) -> str`) do not depend on one task; they are sent on every connect
(so a page re-syncs after a reconnect) and after every change the connection hears of: nav counts.
Register from the page's module, imported at start-up (e.g. in its AppConfig.ready()).
Renderers must escape everything that came from an MCP server (render templates; never mark it safe).
"""

import enum
import logging
from collections.abc import Callable, Iterable

logger = logging.getLogger(__name__)


class FragmentKind(enum.StrEnum):
    TASKS = "tasks"
    TASK = "task"
    INBOX = "inbox"


TaskFragment = Callable[..., str]  # render(task, user) -> str
UserFragment = Callable[..., str]  # render(user) -> str

_task_fragments: dict[FragmentKind, list[TaskFragment]] = {kind: [] for kind in FragmentKind}
_user_fragments: list[UserFragment] = []


def register_task_fragment(kind: FragmentKind, render: TaskFragment | None = None):
    """Register `render(task, user) -> str` for one kind; usable as a decorator."""

    def register(function: TaskFragment) -> TaskFragment:
        if function not in _task_fragments[FragmentKind(kind)]:
            _task_fragments[FragmentKind(kind)].append(function)
        return function

    return register(render) if render is not None else register


def unregister_task_fragment(kind: FragmentKind, render: TaskFragment) -> None:
    if render in _task_fragments[FragmentKind(kind)]:
        _task_fragments[FragmentKind(kind)].remove(render)


def register_user_fragment(render: UserFragment) -> UserFragment:
    """Register `render(user) -> str`, sent on connect and after every change; usable as a decorator."""
    if render not in _user_fragments:
        _user_fragments.append(render)
    return render


def render_task_fragments(kinds: Iterable[FragmentKind], task, user) -> list[str]:
    return [
        html
        for kind in dict.fromkeys(kinds)
        for render in list(_task_fragments[kind])
        if (html := _render_safely(render, task, user))
    ]


def render_user_fragments(user) -> list[str]:
    return [html for render in list(_user_fragments) if (html := _render_safely(render, user))]


def _render_safely(render: Callable[..., str], *args) -> str:
    # One page's broken fragment must not cost the user the others, nor the socket.
    try:
        return render(*args) or ""
    except Exception:
        logger.exception("live fragment %s failed; it is left out", getattr(render, "__qualname__", render))
        return ""


def _register_defaults() -> None:
    from taskhub.live import nav

    register_user_fragment(nav.nav_counts_fragment)


_register_defaults()
