"""Issue 31 point 10: a worker exits within its shutdown timeout whatever its jobs and stdio processes do.

A real `manage.py worker` holds a stdio server that never answers a tools/call, ignores SIGTERM and stays after its
stdin closes (tests/hostile_stdio_server.py, HOSTILE_STUBBORN), and an HTTP server that never answers one either
(tests/hostile_server.py, Silence): a launch hangs on each, one on the stdio server's own queue and one on the
default queue. From SIGTERM the worker is gone within its timeout, and so is the stdio process's group.
Before, each stage waited its own timeout after the other's (the default runner's, then the stdio queue's, then the
process's stop): this worker took 2-3 times its timeout.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from taskhub.accounts.groups import ADMINS
from taskhub.servers.models import ServerProcess
from taskhub.servers.services import create_server
from taskhub.tasks import services
from tests.account_fixtures import make_user
from tests.catalogue_fixtures import with_tools
from tests.helpers import wait_until
from tests.hostile_server import HostileServer, Silence
from tests.stack_fixtures import worker_log

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SERVER_SCRIPT = str(Path(__file__).with_name("hostile_stdio_server.py"))
SHUTDOWN_TIMEOUT = 8.0
# What the interpreter takes to exit once the worker's loop has ended (measured: well under a second).
EXIT_SLACK_SECONDS = 1.5


def gone(pid: int) -> bool:
    """No such process, or only its zombie (reparented, nobody may reap it in a container)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


def test_a_worker_exits_within_its_shutdown_timeout_whatever_its_stdio_process_and_jobs_do(workers):
    admin = make_user("ada", ADMINS)
    with HostileServer() as http_server:
        http_server.tool("hang", Silence())
        over_http = create_server(name="silent over http", transport="http", url=http_server.url, user=admin)
        over_stdio = create_server(
            name="stubborn over stdio",
            transport="stdio",
            command=sys.executable,
            args=[SERVER_SCRIPT],
            env={"HOSTILE_STUBBORN": "1"},
            user=admin,
        )
        services.launch(server=with_tools(over_http, "hang"), tool="hang", arguments={}, user=admin)
        services.launch(server=with_tools(over_stdio, "hang"), tool="hang", arguments={"taskId": "hang-1"}, user=admin)
        worker = workers.start("stubborn", "--shutdown-timeout", str(SHUTDOWN_TIMEOUT))
        wait_until(lambda: http_server.tool_calls == ["hang"], timeout=60, what="the HTTP launch to hang")
        process = wait_until(
            lambda: ServerProcess.objects.filter(
                server=over_stdio, stderr_tail__contains=["holding tools/call hang-1"]
            ).first(),
            timeout=60,
            what="the stdio launch to hang",
        )
        assert process.pid and not gone(process.pid)

        worker.send_signal(signal.SIGTERM)
        told = time.monotonic()
        returncode = worker.wait(timeout=SHUTDOWN_TIMEOUT * 4)
        took = time.monotonic() - told

    log = worker_log("stubborn").read_text()
    assert took <= SHUTDOWN_TIMEOUT + EXIT_SLACK_SECONDS, f"exited {took:.1f} s after SIGTERM\n{log[-4000:]}"
    assert returncode == 0, log[-4000:]  # not the watchdog's 70: the worker's own wind-down ended in time
    wait_until(lambda: gone(process.pid), timeout=5, what="the stdio process to be gone")
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, 0)
