"""Django's PostgreSQL backend, with a health check that asks the socket before it asks Postgres (liveness.py), and
cursors whose statements Postgres keeps prepared (prepared_cursor).

settings.DATABASES names it for a DATABASE_URL of PostgreSQL; the embedded server's backend builds on it."""

import psycopg
from django.db.backends.postgresql import base
from django.utils.asyncio import async_unsafe

from taskhub.database import liveness

# How many times a statement runs through prepared_cursor() on a connection before psycopg prepares it: at once.
# Django's own cursors bind their parameters on the client, and psycopg prepares none of theirs.
PREPARE_THRESHOLD = 0


class DatabaseWrapper(base.DatabaseWrapper):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._binding_on_server = False

    def is_usable(self):
        if self.connection is not None and liveness.quiet(self.connection):
            return True
        return super().is_usable()

    def get_connection_params(self):
        params = super().get_connection_params()
        # Django passes None (nothing prepared) unless OPTIONS say otherwise; with server_side_binding every cursor
        # binds on the server, and psycopg's own default then applies to all of them.
        if (
            params.get("prepare_threshold") is None
            and self.settings_dict["OPTIONS"].get("server_side_binding") is not True
        ):
            params["prepare_threshold"] = PREPARE_THRESHOLD
        return params

    @async_unsafe
    def prepared_cursor(self):
        """A cursor as `cursor()` is (Django's wrapper: its errors, its execute wrappers, the queries it logs), but
        binding its parameters on the server, so that psycopg prepares each statement it runs once per connection:
        Postgres parses and plans it then, not on every run. For the hand-written statements that run on every request
        or change: planning a join of five tables took 0.7 ms of the 1.1 its run took, prepared 0.3 (consumer's task
        read). Each names its SQL text once: a text built anew, with values in it, would be prepared anew every time.
        Only where no pooler between taskhub and Postgres forgets a connection's prepared statements (PgBouncer in
        transaction mode before 1.21)."""
        self._binding_on_server = True
        try:
            return self._cursor()
        finally:
            self._binding_on_server = False

    def create_cursor(self, name=None):
        if name or not self._binding_on_server:
            return super().create_cursor(name)
        # Django's own making of the cursor (its time zone), with psycopg's cursor that binds on the server.
        factory, self.connection.cursor_factory = self.connection.cursor_factory, psycopg.Cursor
        try:
            return super().create_cursor(name)
        finally:
            self.connection.cursor_factory = factory
