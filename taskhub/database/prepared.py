"""A cursor whose statements Postgres keeps prepared (base.DatabaseWrapper.prepared_cursor), for the hand-written
statements on the hottest paths."""

from django.db import connection as default_connection


def prepared_cursor(connection=None):
    """`connection.prepared_cursor()` (the default connection's if None); a plain cursor on a backend other than
    taskhub's (one a deployment configured by hand), which runs the same statements unprepared."""
    connection = connection if connection is not None else default_connection
    make = getattr(connection, "prepared_cursor", None)
    return make() if make is not None else connection.cursor()
