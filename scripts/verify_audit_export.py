#!/usr/bin/env python3
"""Verify a taskhub audit export or archive offline: Python 3.11+, the standard library only, no database.

    python3 scripts/verify_audit_export.py taskhub-audit-20261204T101500Z.json   # the Audit page's JSON export
    python3 scripts/verify_audit_export.py taskhub-audit-2026-11.jsonl           # an archive (manage.py audit archive)
    python3 scripts/verify_audit_export.py --filtered export.json                # an export of some rows only

taskhub's audit trail is one hash chain per month (UTC): each row carries `prev_hash`, the `hash` of the month's
previous row (64 zeros for its first), and `hash` = SHA-256(prev_hash bytes + content), where content is the text of
the JSON array [id, time in microseconds since 1970, actor_id, actor_label, action, task_id, server_id, data] as
Postgres writes jsonb (keys by length then bytes, ", " and ": " between items, numbers as exported). A month's
chain runs in the order of `seq` (exports made before audit migration 0011 have none: their id order is their chain
order). This script recomputes every row's hash and, per month, checks that each row's prev_hash is the hash of the
row before it, so an edited, deleted or reordered row shows. A row with no hash yet (written just before the export,
not yet sealed into the chain) is counted and left out: it is not evidence either way. It prints each month's row
count and head (its last row's hash): compare the heads with `manage.py audit verify` (or the archive's header) to
know that no row was cut off the end either.

An export of all rows of a month verifies whole. A filtered export (a task, an actor...) leaves gaps by design: with
--filtered only each row's own hash is checked. Exit status: 0 whole, 1 broken, 2 unreadable.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import sys

GENESIS = "0" * 64
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


class Number(str):
    """A number kept as the export wrote it (Postgres's own digits), not as a Python float re-formats it."""


def jsonb_text(value) -> str:
    """`value` as Postgres's jsonb output writes it."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, Number):
        return str(value)
    if isinstance(value, str):
        return jsonb_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(jsonb_text(item) for item in value) + "]"
    if isinstance(value, dict):
        keys = sorted(value, key=lambda key: (len(key.encode()), key.encode()))
        return "{" + ", ".join(f"{jsonb_string(key)}: {jsonb_text(value[key])}" for key in keys) + "}"
    raise ValueError(f"not a JSON value: {value!r}")


ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def jsonb_string(text: str) -> str:
    out = []
    for char in text:
        if char in ESCAPES:
            out.append(ESCAPES[char])
        elif char < " ":
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def microseconds(iso: str) -> int:
    moment = datetime.datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return (moment - EPOCH) // datetime.timedelta(microseconds=1)


def row_hash(row: dict) -> str:
    content = [
        row["id"],
        Number(microseconds(row["time"])),
        row["actor_id"],
        row["actor_label"],
        row["action"],
        row["task_id"],
        row["server_id"],
        row["data"],
    ]
    return hashlib.sha256(bytes.fromhex(row["prev_hash"]) + jsonb_text(content).encode()).hexdigest()


def read_rows(path: str) -> tuple[list[dict], dict | None]:
    """The rows of a JSON export (one array) or of a JSONL archive (a header line, then one row a line)."""
    with open(path, encoding="utf-8") as file:
        text = file.read()
    load = lambda chunk: json.loads(chunk, parse_int=Number, parse_float=Number)  # noqa: E731
    if text.lstrip().startswith("["):
        return load(text), None
    lines = [load(line) for line in text.splitlines() if line.strip()]
    header = lines[0] if lines and "taskhub_audit_archive" in lines[0] else None
    return (lines[1:] if header else lines), header


def chain_order(row: dict) -> tuple[int, int]:
    seq = row.get("seq")
    return (int(seq) if seq is not None else int(row["id"]), int(row["id"]))


def verify(rows: list[dict], *, filtered: bool) -> tuple[dict[str, dict], list[str]]:
    months: dict[str, list[dict]] = {}
    unsealed: dict[str, int] = {}
    for row in rows:
        if row.get("hash") is None:
            unsealed[row["time"][:7]] = unsealed.get(row["time"][:7], 0) + 1
            continue
        months.setdefault(row["time"][:7], []).append(row)
    report, problems = {}, []
    for month, chain in sorted(months.items()):
        chain.sort(key=chain_order)
        previous = None
        for row in chain:
            if row_hash(row) != row["hash"]:
                problems.append(f"{month}: row {row['id']} does not match its hash (changed)")
                break
            expected = previous["hash"] if previous else GENESIS
            if not filtered and row["prev_hash"] != expected:
                where = "the month's first rows are missing" if previous is None else "a row is missing or moved"
                problems.append(f"{month}: chain broken at row {row['id']}: {where} before it")
                break
            previous = row
        report[month] = {"rows": len(chain), "head": chain[-1]["hash"], "unsealed": unsealed.pop(month, 0)}
    for month, count in unsealed.items():
        report[month] = {"rows": 0, "head": "", "unsealed": count}
    return report, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="a JSON export (Audit page) or a JSONL archive (manage.py audit archive)")
    parser.add_argument("--filtered", action="store_true", help="an export of some rows: check each row's hash only")
    args = parser.parse_args(argv)
    try:
        rows, header = read_rows(args.file)
    except (OSError, ValueError) as error:
        print(f"cannot read {args.file}: {error}", file=sys.stderr)
        return 2
    report, problems = verify(rows, filtered=args.filtered)
    if header is not None:
        month = report.get(header["month"], {"rows": 0, "head": ""})
        if (int(header["rows"]), header["head"]) != (month["rows"], month["head"]):
            problems.append(
                f"{header['month']}: the archive's header says {header['rows']} rows ending in"
                f" {header['head']}, its rows say {month['rows']} ending in {month['head']}"
            )
    for month, facts in report.items():
        waiting = f", {facts['unsealed']} not sealed yet (left out)" if facts.get("unsealed") else ""
        print(f"{month}: {facts['rows']} rows, head {facts['head']}{waiting}")
    for problem in problems:
        print(f"BROKEN {problem}")
    print("whole" if not problems else "broken", f"({len(rows)} rows{', filtered' if args.filtered else ''})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
