"""The stdio transport for a server we do not trust: the SDK's `stdio_client`, with its output bounded.

The SDK's transport (mcp 2.3) reads stdout lines of any length (a line without a newline is re-joined on
every 64 KB read: a 30 MB line costs seconds of the event loop every tracker shares), surfaces a line that is
not JSON-RPC only as an exception nobody awaits (the request it answered then times out), and hands the
server the worker's own stderr (so whatever the server prints, the environment we gave it included, lands
in the worker's log as is). Here:

- a stdout line is at most `wire.MAX_RESPONSE_BYTES`; a longer one is skipped to its end, and it, a line
  that is not JSON-RPC, or half a line at the end of stdout is handed to the session as a `BadLine`
  (`TasksClient` fails the requests waiting at that moment with an `InvalidResult`); so is an answer to a
  request that was not sent (or is answered already), which the SDK would drop while its request waits;
- stderr goes to the `taskhub.mcp.stderr` logger at INFO, line by line, with every value of the server's configured
  environment blanked out, at most `STDERR_LOG_MAX_BYTES` a minute (the rest is read and dropped, so a loud
  server never blocks on a full pipe).

A long-lived process (the worker keeps one per stdio server) is watched through a `ProcessObserver`: told its
pid when it starts, each redacted stderr line the log budget lets through, and its exit; `before_start` may
hold a restart back (backoff) or refuse it.

Process shutdown (close stdin, wait, kill the process group) and draining stdout are the SDK's own helpers
(private ones, reached through `taskhub.mcp.sdk_private`).
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Protocol

import anyio
import anyio.lowlevel
import mcp_types
from anyio.abc import ByteReceiveStream
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from taskhub.mcp import wire
from taskhub.mcp.sdk_private import TransportStreams, drain_stdout, stop_server_process

logger = logging.getLogger(__name__)
stderr_logger = logging.getLogger("taskhub.mcp.stderr")

STDERR_LOG_MAX_BYTES = 64 * 1024
STDERR_LOG_WINDOW_SECONDS = 60.0
STDERR_LINE_MAX_BYTES = 8 * 1024
QUOTE_MAX_CHARS = 120
REDACTED = "[redacted]"
# Shorter values (a port, "true") are no credential, and blanking them would garble every line.
MIN_REDACTED_CHARS = 4
_WRITER_FLUSH_TIMEOUT = 0.5


class ProcessObserver(Protocol):
    async def before_start(self) -> None:
        """Called before the process is started; may wait, or raise to refuse the start."""

    def started(self, pid: int) -> None: ...

    def stderr_line(self, text: str) -> None:
        """A line the server wrote on stderr, redacted and capped (the lines past the log budget are not seen)."""

    def exited(self, returncode: int | None) -> None: ...


class BadLine(ValueError):
    """Something on the server's stdout that is not one JSON-RPC message."""


class OpenRequests:
    """The ids of the requests sent and not yet answered, to tell an answer to another request apart."""

    def __init__(self, limit: int = 10_000) -> None:
        self._ids: dict[str, None] = {}
        self._limit = limit  # requests abandoned unanswered must not pile up

    def sent(self, message: object) -> None:
        if isinstance(message, mcp_types.JSONRPCRequest):
            self._ids[str(message.id)] = None
            if len(self._ids) > self._limit:
                del self._ids[next(iter(self._ids))]

    def answered(self, item: SessionMessage | BadLine) -> SessionMessage | BadLine:
        message = item.message if isinstance(item, SessionMessage) else None
        if not isinstance(message, mcp_types.JSONRPCResponse | mcp_types.JSONRPCError) or message.id is None:
            return item
        key = str(message.id)
        if key in self._ids:
            del self._ids[key]
            return item
        # The id is left out: it changes with every request, and the same problem is noted once in a row.
        return BadLine("the server answered a request it was not sent, or one answered already")


def redactor(env: Mapping[str, str] | None) -> Callable[[str], str]:
    """Blank out every configured environment value (longest first, so a value inside another goes too)."""
    secrets = sorted({value for value in (env or {}).values() if len(value) >= MIN_REDACTED_CHARS}, key=len)[::-1]

    def redact(text: str) -> str:
        for secret in secrets:
            text = text.replace(secret, REDACTED)
        return text

    return redact


class LineSplitter:
    """Split a byte stream into lines of at most `max_bytes`, in time linear in its length."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._parts: list[bytes] = []
        self._size = 0
        self._skipping = 0  # bytes of an over-long line skipped so far

    def feed(self, chunk: bytes) -> list[bytes | int]:
        """Complete lines (without the newline), or the size of an over-long line that was skipped."""
        found: list[bytes | int] = []
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            self._take(chunk[start:end])
            if self._skipping:
                found.append(self._skipping)
            else:
                found.append(b"".join(self._parts))
            self._parts, self._size, self._skipping = [], 0, 0
            start = end + 1
        self._take(chunk[start:])
        return found

    def rest(self) -> bytes | int | None:
        """What is left at the end of the stream: part of a line, or the size of an over-long one."""
        if self._skipping:
            return self._skipping
        return b"".join(self._parts) if self._size else None

    def _take(self, piece: bytes) -> None:
        if self._skipping:
            self._skipping += len(piece)
            return
        self._parts.append(piece)
        self._size += len(piece)
        if self._size > self.max_bytes:
            self._skipping, self._parts, self._size = self._size, [], 0


def parse_line(line: bytes | int, redact: Callable[[str], str]) -> SessionMessage | BadLine | None:
    if isinstance(line, int):
        return BadLine(f"the server wrote a line longer than {wire.MAX_RESPONSE_BYTES} bytes ({line} bytes)")
    if not line.strip():
        return None
    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValidationError:
        quote = redact(line[: QUOTE_MAX_CHARS * 4].decode("utf-8", "replace"))[:QUOTE_MAX_CHARS]
        return BadLine(f"the server wrote a line that is not JSON-RPC: {quote!r}")


class StderrLog:
    """Log a server's stderr lines: redacted, each line capped, at most a budget of bytes per window."""

    def __init__(self, name: str, redact: Callable[[str], str], also: Callable[[str], None] | None = None) -> None:
        self.name = name
        self.redact = redact
        self.also = also
        self._window_start = time.monotonic()
        self._logged = 0
        self._dropped = 0

    def line(self, line: bytes | int) -> None:
        now = time.monotonic()
        if now - self._window_start >= STDERR_LOG_WINDOW_SECONDS:
            self._flush_dropped()
            self._window_start, self._logged = now, 0
        size = line if isinstance(line, int) else len(line)
        if self._logged + size > STDERR_LOG_MAX_BYTES:
            if not self._dropped:
                stderr_logger.warning(
                    "%s: stderr output dropped (over %d bytes a minute)", self.name, STDERR_LOG_MAX_BYTES
                )
            self._dropped += size
            return
        self._logged += size
        if isinstance(line, int):
            stderr_logger.warning("%s: stderr line of %d bytes dropped (too long)", self.name, line)
        else:
            text = self.redact(line.decode("utf-8", "replace").rstrip())
            # INFO: a server's stderr is its own log (start-up banners, its INFO lines), nothing wrong by itself; the
            # server's page keeps its last lines. What taskhub drops is a WARNING.
            stderr_logger.info("%s: %s", self.name, text)
            if self.also is not None:
                self.also(text)

    def close(self) -> None:
        self._flush_dropped()

    def _flush_dropped(self) -> None:
        if self._dropped:
            stderr_logger.warning("%s: %d bytes of stderr output dropped", self.name, self._dropped)
            self._dropped = 0


async def _log_stderr(stream: ByteReceiveStream, log: StderrLog) -> None:
    lines = LineSplitter(STDERR_LINE_MAX_BYTES)
    with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        while True:
            for line in lines.feed(await stream.receive()):
                log.line(line)
    rest = lines.rest()
    if rest is not None:
        log.line(rest)
    log.close()


@asynccontextmanager
async def stdio_transport(
    *,
    command: str,
    args: list[str],
    env: Mapping[str, str] | None,
    cwd: str | None,
    observer: ProcessObserver | None = None,
) -> AsyncIterator[TransportStreams]:
    redact = redactor(env)
    if observer is not None:
        await observer.before_start()
    process = await anyio.open_process(
        [command, *args],
        env=get_default_environment() | dict(env or {}),
        stderr=subprocess.PIPE,
        cwd=cwd,
        start_new_session=True,
    )
    assert process.stdout and process.stdin and process.stderr
    stderr_log = StderrLog(f"{command} (pid {process.pid})", redact, observer.stderr_line if observer else None)
    if observer is not None:
        observer.started(process.pid)
    read_stream_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_stream_reader = anyio.create_memory_object_stream[SessionMessage](0)
    writer_done = anyio.Event()
    stderr_done = anyio.Event()
    open_requests = OpenRequests()

    async def stderr_reader() -> None:
        assert process.stderr
        try:
            await _log_stderr(process.stderr, stderr_log)
        finally:
            stderr_done.set()

    async def stdout_reader() -> None:
        assert process.stdout
        lines = LineSplitter(wire.MAX_RESPONSE_BYTES)
        try:
            async with read_stream_writer:
                with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                    while True:
                        for line in lines.feed(await process.stdout.receive()):
                            if (item := parse_line(line, redact)) is not None:
                                await read_stream_writer.send(open_requests.answered(item))
                rest = lines.rest()
                if rest is not None:
                    cut = parse_line(rest, redact)
                    if isinstance(cut, BadLine):
                        cut = BadLine(f"the server closed its stdout in the middle of a message ({cut})")
                    if cut is not None:
                        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                            await read_stream_writer.send(cut)
        finally:
            await drain_stdout(process)

    async def stdin_writer() -> None:
        assert process.stdin
        try:
            async with write_stream_reader:
                async for session_message in write_stream_reader:
                    open_requests.sent(session_message.message)  # before it is sent: its answer cannot come first
                    data = session_message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((data + "\n").encode())
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_stream_writer.aclose()
        finally:
            writer_done.set()

    told_exit = False

    def tell_exit() -> None:
        nonlocal told_exit
        if observer is not None and not told_exit:
            told_exit = True
            observer.exited(process.returncode)

    async def exit_watcher() -> None:
        # The observer hears of an exit when it happens, not when the connection is next used or closed.
        with suppress(Exception):
            await process.wait()
            with anyio.move_on_after(_WRITER_FLUSH_TIMEOUT):
                await stderr_done.wait()  # its last words first
            tell_exit()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(stdout_reader)
        tasks.start_soon(stdin_writer)
        tasks.start_soon(stderr_reader)
        if observer is not None:
            tasks.start_soon(exit_watcher)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                read_stream.close()
                write_stream.close()
                with anyio.move_on_after(_WRITER_FLUSH_TIMEOUT):
                    await writer_done.wait()
                await stop_server_process(process)
                with anyio.move_on_after(_WRITER_FLUSH_TIMEOUT):
                    await stderr_done.wait()  # its last words, when it had any
                tell_exit()
                with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await process.stderr.aclose()
                for stream in (read_stream, write_stream, read_stream_writer, write_stream_reader):
                    await stream.aclose()
            tasks.cancel_scope.cancel()
    await anyio.lowlevel.cancel_shielded_checkpoint()
