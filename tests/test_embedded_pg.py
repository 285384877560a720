"""Embedded Postgres shared by real processes: the last user to leave stops it, whatever the exit."""

import os
import signal
import subprocess
import sys
import threading

import psutil
import psycopg
import pytest

from taskhub import embedded_pg
from tests.conftest import PROJECT_DIR
from tests.helpers import wait_until

pytestmark = pytest.mark.slow

# A user of the server: joins, prints the postmaster pid, waits for a signal. Ctrl-C works as in a terminal even when
# the test run was started in the background, which makes its children inherit SIGINT as ignored.
USER_PROCESS = """
import signal
signal.signal(signal.SIGINT, signal.default_int_handler)
from taskhub import embedded_pg
print(embedded_pg.ensure_started().pid, flush=True)
signal.pause()
"""


@pytest.fixture(scope="module")
def pgdata(tmp_path_factory):
    path = tmp_path_factory.mktemp("embedded") / "pgdata"
    yield path
    embedded_pg.stop_server(path)  # whatever a failing test left behind


def start_user(pgdata) -> tuple[subprocess.Popen, int]:
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    env["TASKHUB_PGDATA"] = str(pgdata)
    process = subprocess.Popen(
        [sys.executable, "-c", USER_PROCESS], env=env, cwd=PROJECT_DIR, stdout=subprocess.PIPE, text=True
    )
    line = process.stdout.readline()
    assert line.strip().isdigit(), f"user process did not report a server (exit code {process.poll()})"
    return process, int(line)


def end(process: subprocess.Popen, signum: int) -> None:
    process.send_signal(signum)
    process.wait(timeout=30)


def wait_until_gone(pid: int) -> None:
    wait_until(lambda: not psutil.pid_exists(pid), timeout=15, what=f"process {pid} to exit")


def test_two_processes_share_one_server_and_the_last_one_stops_it(pgdata):
    first, server_pid = start_user(pgdata)
    second, second_server_pid = start_user(pgdata)
    assert second_server_pid == server_pid

    end(first, signal.SIGTERM)
    assert psutil.pid_exists(server_pid), "the server stopped while another process still used it"

    end(second, signal.SIGTERM)
    wait_until_gone(server_pid)
    assert embedded_pg.running_server(pgdata) is None


def test_sigint_stops_the_server(pgdata):
    user, server_pid = start_user(pgdata)
    end(user, signal.SIGINT)
    wait_until_gone(server_pid)


def test_a_killed_user_leaves_the_server_running_and_the_next_user_cleans_up(pgdata):
    killed, server_pid = start_user(pgdata)
    end(killed, signal.SIGKILL)
    assert psutil.pid_exists(server_pid), "pgserver cannot stop on SIGKILL; this test expects the leftover server"

    successor, successor_server_pid = start_user(pgdata)
    assert successor_server_pid == server_pid  # joined the leftover instead of fighting it
    assert killed.pid not in embedded_pg.handle_pids(pgdata)

    end(successor, signal.SIGTERM)
    wait_until_gone(server_pid)


def test_stop_server_stops_it_whoever_uses_it(pgdata):
    user, server_pid = start_user(pgdata)
    try:
        assert embedded_pg.stop_server(pgdata) is True
        wait_until_gone(server_pid)
        assert embedded_pg.stop_server(pgdata) is False
    finally:
        end(user, signal.SIGTERM)


def test_processes_joining_at_once_each_find_the_database_whichever_creates_it(pgdata):
    """ensure_started creates taskhub's database on the server it joins. Several processes joining at once all try; the
    CREATEs that lose the race must not fail (Postgres reports some as a duplicate key in its catalog)."""
    user, _ = start_user(pgdata)
    try:
        server = embedded_pg.running_server(pgdata)
        for attempt in range(3):
            name = f"joined_at_once_{attempt}"
            barrier = threading.Barrier(6)
            failures: list[BaseException] = []

            def create(name=name, barrier=barrier, failures=failures) -> None:
                barrier.wait(timeout=30)
                try:
                    embedded_pg._create_database(server, name)
                except BaseException as error:  # every failure is the finding
                    failures.append(error)

            threads = [threading.Thread(target=create) for _ in range(6)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
            assert failures == []
            with psycopg.connect(
                host=str(server.socket_dir), port=server.port, user=embedded_pg.USER, dbname=name, autocommit=True
            ) as conn:
                assert conn.execute("SELECT current_database()").fetchone() == (name,)
    finally:
        end(user, signal.SIGTERM)
