"""Log filters for the console handler (settings.LOGGING)."""

import logging


class RefusalsWithoutTraceback(logging.Filter):
    """A refused request (a 4xx: 400 bad Host or request, 403 permission denied, 404) is the client's doing: its
    one line (level, path, reason) is kept, the traceback Django attaches to some of them is dropped. Errors (5xx)
    keep theirs. Django logs a SuspiciousOperation it answers with 400 (django.security.*, e.g. DisallowedHost: a
    Host not in ALLOWED_HOSTS, which every scanner sends) at ERROR: it is a WARNING here, like the other refusals.

    On the console handler (settings.LOGGING), and on the django.security.DisallowedHost logger too, so that other
    handlers (mail_admins at ERROR, an error tracker) see it as a warning as well."""

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if isinstance(status, int) and 400 <= status < 500:
            record.exc_info = None
            record.exc_text = None
            record.stack_info = None
            if record.name.startswith("django.security.") and record.levelno > logging.WARNING:
                record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return True
