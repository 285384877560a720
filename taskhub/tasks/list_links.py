"""Links to the task list with its filters (queries.TaskFilterForm's names), as Home's counts and charts make them."""

from urllib.parse import urlencode

from django.urls import get_resolver, get_script_prefix, get_urlconf, reverse
from django.utils.translation import get_language

_list_paths: dict[tuple, str] = {}


def tasks_href(**filters) -> str:
    """The task list's link with these filters (those given a value), as Home's counts and charts link to it. The
    list's path is reversed once per URLconf, script prefix and language: Home has some thirty of these links."""
    key = (get_resolver(get_urlconf()), get_script_prefix(), get_language())
    path = _list_paths.get(key)
    if path is None:
        path = _list_paths[key] = reverse("tasks:list")
    kept = {name: value for name, value in filters.items() if value not in ("", None)}
    return path + (f"?{urlencode(kept)}" if kept else "")
