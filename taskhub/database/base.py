"""Django's PostgreSQL backend, with a health check that asks the socket before it asks Postgres (liveness.py).

settings.DATABASES names it for a DATABASE_URL of PostgreSQL; the embedded server's backend builds on it."""

from django.db.backends.postgresql import base

from taskhub.database import liveness


class DatabaseWrapper(base.DatabaseWrapper):
    def is_usable(self):
        if self.connection is not None and liveness.quiet(self.connection):
            return True
        return super().is_usable()
