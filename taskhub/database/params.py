"""The default database's connection parameters, for the psycopg connections taskhub opens beside Django's (the
tracker's, the worker's heartbeat and held answers' LISTEN, a server's token-refresh lock)."""

from typing import Any

from django import db


def database_params() -> dict[str, Any]:
    params = dict(db.connections["default"].get_connection_params())
    for django_only in ("cursor_factory", "context"):
        params.pop(django_only, None)
    return params
