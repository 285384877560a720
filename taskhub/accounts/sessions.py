"""Django's database sessions (SESSION_ENGINE), the session of a request read with one hand-written statement.

Every signed-in request reads its session first. Django's store reads it through the ORM (`Session.objects.get`),
whose query building took more of the request's time than the statement itself (bench/answer_path.py). Everything
else (saving, creating, deleting, expiry) is Django's own store.
"""

from django.contrib.sessions.backends import db
from django.db import connections, router
from django.utils import timezone

from taskhub.database.prepared import prepared_cursor


class SessionStore(db.SessionStore):
    def _get_session_from_db(self):
        """What Django's store reads (the row of this key, unexpired; the key forgotten when there is none)."""
        model = self.model
        with prepared_cursor(connections[router.db_for_read(model)]) as cursor:
            cursor.execute(_SESSION_SQL.format(table=model._meta.db_table), [self.session_key, timezone.now()])
            row = cursor.fetchone()
        if row is None:
            self._session_key = None
            return None
        return model(session_key=self.session_key, session_data=row[0], expire_date=row[1])


_SESSION_SQL = 'SELECT session_data, expire_date FROM "{table}" WHERE session_key = %s AND expire_date > %s'
