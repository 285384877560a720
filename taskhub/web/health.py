"""What /healthz and the home page report about the system."""

import logging
import time

from django.db import DatabaseError, connections

logger = logging.getLogger(__name__)


def database_status(*, with_version: bool, alias: str = "default") -> dict:
    """with_version: the server's version, for admins only (on a public page it tells an attacker which holes
    to try)."""
    connection = connections[alias]
    embedded = connection.settings_dict["ENGINE"] == "taskhub.embedded_pg"
    started = time.monotonic()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('server_version')")
            (version,) = cursor.fetchone()
    except DatabaseError as error:
        logger.warning("database check failed: %s", error)
        # The exception text can name hosts and users; /healthz is public, so only the kind is shown.
        return {"ok": False, "embedded": embedded, "error": type(error).__name__}
    status = {
        "ok": True,
        "embedded": embedded,
        "vendor": connection.vendor,
        "latency_ms": round((time.monotonic() - started) * 1000, 1),
    }
    if with_version:
        status["version"] = version
    return status
