"""The HTML the live socket pushes: htmx out-of-band fragments (elements with an id and `hx-swap-oob`).

Renderers are registered per kind of interest the connection has in a changed task:

    def task_row(task, user) -> str:
        return render_to_string("tasks/list.html#task-row", {"task": task, "oob": True})

    register_task_fragment(FragmentKind.TASKS, task_row)

- TASKS: the user sees every task (operators, admins): list rows, status tab counts.
- TASK_STATUS, TASK: the page watches this task ({"watch": "<uuid>"}): how the task stands (the detail header,
  its status message), sent in a frame of its own before the rest of what the page shows of it (TASK: its timeline,
  its requests), so the new status reaches the screen without waiting for the reads and rendering of the rest.
- INBOX: the task belongs to a server the user approves for: inbox cards.

The live layer registers the pages' renderers in LiveConfig.ready() (task_fragments.register()): the domain's
modules never import this layer (DESIGN.md, "Dependency direction").

User fragments (`render(user) -> str`) do not depend on one task; they are sent on every connect
(so a page re-syncs after a reconnect) and after every change the connection hears of: nav counts.
Renderers must escape everything that came from an MCP server (render templates; never mark it safe).

Sharing: one change reaches hundreds of sockets, so the consumer renders each renderer once per change for
all the sockets that would get the same bytes:

- Sharing.USER (the default): once per user; for what names the user ("answered by you").
- Sharing.AUDIENCE: once per audience, i.e. per LiveAccess (roles and servers approved for) and language (each
  socket's, activated while its fragments render), and the bytes go to every user of that audience. Only for a
  renderer whose output depends on the user through nothing but that access (it is called with one of the
  audience's users): the list signal, the nav counts.
"""

import enum
import logging
from collections.abc import Callable, Iterable

logger = logging.getLogger(__name__)


class FragmentKind(enum.StrEnum):
    TASKS = "tasks"
    TASK_STATUS = "task-status"
    TASK = "task"
    INBOX = "inbox"


class Sharing(enum.StrEnum):
    USER = "user"
    AUDIENCE = "audience"


TaskFragment = Callable[..., str]  # render(task, user) -> str
UserFragment = Callable[..., str]  # render(user) -> str

_task_fragments: dict[FragmentKind, list[tuple[TaskFragment, Sharing]]] = {kind: [] for kind in FragmentKind}
_user_fragments: list[tuple[UserFragment, Sharing]] = []


def register_task_fragment(kind: FragmentKind, render: TaskFragment | None = None, *, sharing=Sharing.USER):
    """Register `render(task, user) -> str` for one kind; usable as a decorator."""

    def register(function: TaskFragment) -> TaskFragment:
        unregister_task_fragment(kind, function)
        _task_fragments[FragmentKind(kind)].append((function, Sharing(sharing)))
        return function

    return register(render) if render is not None else register


def unregister_task_fragment(kind: FragmentKind, render: TaskFragment) -> None:
    registered = _task_fragments[FragmentKind(kind)]
    registered[:] = [entry for entry in registered if entry[0] != render]


def register_user_fragment(render: UserFragment, *, sharing=Sharing.USER) -> UserFragment:
    """Register `render(user) -> str`, sent on connect and after every change."""
    global _user_fragments
    _user_fragments = [entry for entry in _user_fragments if entry[0] != render] + [(render, Sharing(sharing))]
    return render


def registered_task_fragments(kind: FragmentKind, sharing: Sharing) -> list[TaskFragment]:
    return [render for render, shared in _task_fragments[FragmentKind(kind)] if shared == sharing]


def has_task_fragments(kinds: Iterable[FragmentKind], sharing: Sharing) -> bool:
    return any(registered_task_fragments(kind, sharing) for kind in kinds)


def has_user_fragments(sharing: Sharing) -> bool:
    return any(shared == sharing for _, shared in _user_fragments)


def render_task_fragments(kinds: Iterable[FragmentKind], task, user, *, sharing: Sharing | None = None) -> list[str]:
    """The fragments of these kinds for this task; of one sharing only if given, else all."""
    return [
        html
        for kind in dict.fromkeys(kinds)
        for render, shared in list(_task_fragments[kind])
        if sharing in (None, shared) and (html := _render_safely(render, task, user))
    ]


def render_user_fragments(user, *, sharing: Sharing | None = None) -> list[str]:
    return [
        html
        for render, shared in list(_user_fragments)
        if sharing in (None, shared) and (html := _render_safely(render, user))
    ]


def _render_safely(render: Callable[..., str], *args) -> str:
    # One page's broken fragment must not cost the user the others, nor the socket.
    try:
        return render(*args) or ""
    except Exception:
        logger.exception("live fragment %s failed; it is left out", getattr(render, "__qualname__", render))
        return ""


def _register_defaults() -> None:
    from taskhub.live import nav

    register_user_fragment(nav.nav_counts_fragment, sharing=Sharing.AUDIENCE)


_register_defaults()
