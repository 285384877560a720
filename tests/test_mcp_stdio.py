"""The pieces of the stdio transport (taskhub/mcp/stdio.py); the whole of it runs in tests/test_hostile_stdio.py."""

from __future__ import annotations

import logging
import time

from taskhub.mcp import stdio
from taskhub.mcp.stdio import REDACTED, BadLine, LineSplitter, StderrLog, parse_line, redactor


def test_lines_are_split_across_chunks_and_an_over_long_one_is_skipped_to_its_end():
    lines = LineSplitter(10)
    assert lines.feed(b"ab") == []
    assert lines.feed(b"c\nde\n\nf") == [b"abc", b"de", b""]
    assert lines.feed(b"0123456789") == []
    assert lines.feed(b"xyz\nok\n") == [14, b"ok"]
    assert lines.feed(b"tail") == [] and lines.rest() == b"tail"


def test_a_line_of_50_mb_in_64_kb_chunks_is_split_in_linear_time():
    lines = LineSplitter(4 * 1024 * 1024)
    chunk = b"x" * 65536
    started = time.monotonic()
    found = []
    for _ in range(800):
        found += lines.feed(chunk)
    found += lines.feed(b"\n{}\n")
    assert found == [800 * 65536, b"{}"]
    assert time.monotonic() - started < 2, "the SDK's transport re-joins the whole line on every chunk"


def test_a_bad_line_is_described_short_and_redacted():
    redact = redactor({"TOKEN": "s3cret-value", "PORT": "80"})
    problem = parse_line(b"debug: TOKEN=s3cret-value port 80 " + b"y" * 10_000, redact)
    assert isinstance(problem, BadLine)
    assert "s3cret-value" not in str(problem) and REDACTED in str(problem) and "port 80" in str(problem)
    assert len(str(problem)) < 300
    assert isinstance(parse_line(20_000_000, redact), BadLine)
    assert parse_line(b"   ", redact) is None
    assert parse_line(b'{"jsonrpc": "2.0", "method": "notifications/x"}', redact) is not None


def test_stderr_is_logged_redacted_and_capped(caplog, monkeypatch):
    monkeypatch.setattr(stdio, "STDERR_LOG_MAX_BYTES", 1000)
    caplog.set_level(logging.INFO, logger="taskhub.mcp.stderr")
    log = StderrLog("srv", redactor({"KEY": "abcd-secret"}))
    log.line(b"key is abcd-secret")
    for _ in range(100):
        log.line(b"z" * 99)
    log.close()
    messages = [record.getMessage() for record in caplog.records]
    assert messages[0] == f"srv: key is {REDACTED}"
    # Issue 34 item 9: a server's ordinary stderr (its start-up banner) is its own log, not a warning of taskhub's;
    # what taskhub drops of it is.
    levels = {record.getMessage(): record.levelname for record in caplog.records}
    assert levels[messages[0]] == "INFO" and levels[messages[-1]] == "WARNING"
    assert sum(len(message) for message in messages) < 2000
    assert any("stderr output dropped" in message for message in messages)
    assert messages[-1].endswith("bytes of stderr output dropped")
