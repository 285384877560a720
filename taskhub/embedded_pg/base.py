"""Django database backend: PostgreSQL on the embedded server, started on the first connection."""

from taskhub import embedded_pg
from taskhub.database import base


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self):
        server = embedded_pg.ensure_started()
        params = super().get_connection_params()
        params.update(host=str(server.socket_dir), port=server.port, user=embedded_pg.USER)
        return params
