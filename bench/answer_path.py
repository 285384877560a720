"""The answer view and a live change's rendering in one process, against the time Postgres itself takes for their
statements (issue 18 items 1 and 2: where the Python part of the approval path and of a push goes).

No daphne, browser or worker: Django's test client posts the approver's answer (htmx, as the inbox card does) to
the real view with production settings (DEBUG off) on a database of the benchmark's own (the Redis channel layer
takes its publish), and the live fragments
that one change sends to a socket (the list's signal, the inbox's signal, a task page's sections, the nav counts)
are rendered as the live consumer renders them (one `rendering_for` per change). The task's server has an approval
policy naming the approver's group, so the policy is read as in a team's setup. Figures per answer or per render:
p50 of the wall time, the number of statements and the database's own time for them (the sum of each statement's
round trip, timed around its execution: the floor, measured in the same run); the rest is Python.

    uv run python bench/answer_path.py                        # 100 answers, 200 renders of each fragment
    uv run python bench/answer_path.py --samples 30 --no-record

Postgres: --database-url (default $BENCH_ANSWER_PATH_DATABASE_URL or
postgres://postgres@127.0.0.1:5432/taskhub_bench_answer_path), dropped and created by the benchmark.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from benchlib import percentile
from livestack import ROOT, append_results, bench_user, drop, load, prepare, results_header, say

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/taskhub_bench_answer_path"
QUESTION = {
    "method": "elicitation/create",
    "params": {
        "message": "Release?",
        "requestedSchema": {
            "type": "object",
            "properties": {"approve": {"type": "boolean", "title": "Approve?"}},
            "required": ["approve"],
        },
    },
}


def asking_tasks(server, count: int) -> list[int]:
    """`count` tasks of the server, each asking QUESTION as the tracker records it; their request ids. Launched by
    nobody in particular: the policy's default refuses self-approval."""
    from helpers import snapshot

    from taskhub.mcp.client import TaskCreated
    from taskhub.tasks import services
    from taskhub.tasks.models import InputRequest

    ids = []
    for n in range(count):
        task = services.launch(server=server, tool="approval", arguments={}, user=None)
        services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot("working", task_id=f"t{n}")))
        task.refresh_from_db()
        asks = snapshot("input_required", task_id=f"t{n}", inputRequests={"approve": QUESTION}, last_updated_at=None)
        services.apply_snapshot(task=task, snapshot=asks)
        ids.append(InputRequest.objects.get(task=task).pk)
    return ids


def measured(call) -> tuple[float, int, float]:
    """(wall ms, statements, database ms) of one call: each statement's round trip timed around its execution."""
    from django.db import connection

    statements, database = 0, 0.0

    def timed(execute, sql, params, many, context):
        nonlocal statements, database
        began = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            statements += 1
            database += time.perf_counter() - began

    with connection.execute_wrapper(timed):
        started = time.perf_counter()
        call()
        wall = (time.perf_counter() - started) * 1000
    return wall, statements, database * 1000


def answers(client, request_ids: list[int]) -> dict[str, list[float]]:
    from taskhub.tasks.models import InputRequest

    figures: dict[str, list[float]] = {"wall": [], "stored": [], "statements": [], "database": []}
    for request_id in request_ids:
        began = time.time()
        posted = {}

        def post(request_id=request_id, posted=posted):
            posted["response"] = client.post(
                f"/inbox/{request_id}/answer", {"action": "accept", "f:approve": "on"}, HTTP_HX_REQUEST="true"
            )

        wall, statements, database = measured(post)
        answered_at = InputRequest.objects.get(pk=request_id).answered_at
        if posted["response"].status_code != 200 or answered_at is None:
            raise SystemExit(f"the answer was refused: {posted['response'].content.decode()[:2000]}")
        stored = (answered_at.timestamp() - began) * 1000
        for name, value in (("wall", wall), ("stored", stored), ("statements", statements), ("database", database)):
            figures[name].append(value)
    return figures


def renders(task_id, user, samples: int) -> dict[str, dict[str, list[float]]]:
    """Each fragment a change of this task sends to the user's socket, rendered `samples` times, each time in a
    rendering of its own (as the consumer renders each change); the task read once per change comes first."""
    from taskhub.accounts.permissions import with_roles_read_once
    from taskhub.live import fragments
    from taskhub.live.access import current_access, rendering_for
    from taskhub.live.consumer import _task_or_none

    user = with_roles_read_once(user)  # as the socket holds its user
    _, access = current_access(user.pk)
    task = _task_or_none(task_id)
    parts = {"the task, read for the change": lambda: _task_or_none(task_id)}
    for kind, registered in fragments._task_fragments.items():
        for render, _ in registered:
            parts[f"{kind.name.lower()}: {render.__name__}"] = lambda render=render: render(task, user)
    for render, _ in fragments._user_fragments:
        parts[f"every page: {render.__name__}"] = lambda render=render: render(user)
    figures = {}
    for name, part in parts.items():
        figures[name] = {"wall": [], "statements": [], "database": []}
        for _ in range(samples):

            def rendered(part=part):
                with rendering_for(access):
                    part()

            wall, statements, database = measured(rendered)
            figures[name]["wall"].append(wall)
            figures[name]["statements"].append(statements)
            figures[name]["database"].append(database)
    return figures


def row(name: str, figures: dict[str, list[float]], wall: str = "wall") -> str:
    p50, p95 = statistics.median(figures[wall]), percentile(figures[wall], 0.95)
    if wall != "wall":  # a moment inside the call: its statements are not told apart from the rest
        return f"| {name} | {p50:.2f} | {p95:.2f} | | | | |"
    database = statistics.median(figures["database"])
    statements = statistics.median(figures["statements"])
    python = max(p50 - database, 0.0)
    ratio = f"{p50 / database:.1f}x" if database else ""
    return f"| {name} | {p50:.2f} | {p95:.2f} | {statements:.0f} | {database:.2f} | {python:.2f} | {ratio} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=100, help="answers; each fragment is rendered twice as often")
    parser.add_argument(
        "--database-url", default=os.environ.get("BENCH_ANSWER_PATH_DATABASE_URL", DEFAULT_DATABASE_URL)
    )
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "RESULTS.md")
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to RESULTS.md")
    args = parser.parse_args()
    load_start = load()
    say(f"answer path in one process: {args.samples} answers; machine shared (load {load_start})")
    prepare(args.database_url, "redis://127.0.0.1:6379/0", f"benchanswerpath{os.getpid()}")
    try:
        from catalogue_fixtures import with_tools
        from django.contrib.auth.models import Group
        from django.test import Client

        from taskhub.accounts.groups import APPROVERS
        from taskhub.approvals.models import ApprovalPolicy
        from taskhub.servers.services import create_server

        user = bench_user()
        server = create_server(name="bench", transport="http", url="http://127.0.0.1:9/mcp", user=user)
        server = with_tools(server, "approval")
        policy = ApprovalPolicy.objects.create(server=server, tool="")
        policy.groups.add(Group.objects.get(name=APPROVERS))
        warm_up = 10
        request_ids = asking_tasks(server, args.samples + warm_up)
        client = Client(HTTP_HOST="127.0.0.1")
        client.force_login(user)
        answers(client, request_ids[:warm_up])
        posted = answers(client, request_ids[warm_up:])
        wall, stored = statistics.median(posted["wall"]), statistics.median(posted["stored"])
        say(f"answers: p50 {wall:.1f} ms, stored at {stored:.1f} ms")
        # The last answered task: its change shows an answered card (the inbox's signal, the task page's sections).
        from taskhub.tasks.models import InputRequest

        task_id = InputRequest.objects.get(pk=request_ids[-1]).task_id
        rendered = renders(task_id, user, args.samples * 2)
    finally:
        from django.db import connections

        connections.close_all()
        drop(args.database_url)

    lines = results_header(
        "Answer path in one process",
        "uv run python bench/answer_path.py " + (f"--samples {args.samples}" if args.samples != 100 else ""),
        load_start,
    )
    lines += [
        "- stack: Django's test client, production settings (DEBUG off), Postgres (own database), the Redis channel "
        "layer (what a publish sends to); one approval policy on the server, naming the approvers group",
        "- database ms: the sum of the statements' round trips, each timed around its execution (the floor); "
        "Python ms: p50 wall - database",
        "",
        "| what | p50 ms | p95 ms | statements | database ms | Python ms | wall / database |",
        "|---|---:|---:|---:|---:|---:|---:|",
        row("answer: POST → answer stored (answered_at)", posted, "stored"),
        row("answer: the whole POST (commit, publish, the card back)", posted),
    ]
    lines += [row(f"live change: {name}", figures) for name, figures in rendered.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_record:
        append_results(args.results, text)


if __name__ == "__main__":
    main()
