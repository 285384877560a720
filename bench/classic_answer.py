"""A question asked in the middle of a call (a classic `elicitation/create`, issue 32) against a Tasks-extension
question, side by side in one run: from an approver's Accept in the browser until the MCP server receives the answer.

The whole product in real processes, as bench/approval.py runs it (bench/livestack.py: daphne, one `manage.py worker`,
Postgres in a database of the benchmark's own, the Redis channel layer, Debian's chromium through Playwright signed in
as an approver, pinned to core 0). Two servers: bench/demo_control_server.py (the demo server; its `approval` tasks
ask through the extension, and the answer goes out as `tasks/update` from the delivery job) and
bench/classic_question_server.py (a 2025-06-18 server whose tool `ask` asks "Approve?" on its tools/call's event
stream; the worker holding the call sends the answer back as the JSON-RPC response: taskhub/worker/held_questions.py).
Both questions are the same form (one boolean, "Approve?") on the same inbox page, answered alternately one at a
time: tick, Accept. Start: the form's `submit` event in the page (performance.timeOrigin + now()); end: the server's
time.time() when the HTTP request carrying the answer reached it (`tasks/update`; the POST of the response). Same
machine, same clock. Goal (issue 32): the classic path's p50 within 20 ms of the extension's.

    uv run python bench/classic_answer.py                          # 15 of each (~2 min)
    uv run python bench/classic_answer.py --samples 5 --no-record  # a quick look

--samples is at most 15: each classic question holds its call, and with it one of the worker's 20 job slots, until
it is answered. Postgres: --database-url (default $BENCH_CLASSIC_DATABASE_URL or
postgres://postgres@127.0.0.1:5432/taskhub_bench_classic), dropped and created by the benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import urllib.request
from pathlib import Path

from approval import ANSWER_RESPONSE_JS
from livestack import (
    BROWSER_CORES_HELP,
    ROOT,
    ControlServer,
    append_results,
    bench_user,
    browser_cores,
    browser_cores_said,
    drop,
    load,
    prepare,
    register,
    results_header,
    say,
    script_server,
    seed,
    signed_in_browser,
    spread,
    wait_live,
    web_and_worker,
)

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/taskhub_bench_classic"
MAX_SAMPLES = 15
GOAL_WITHIN_MS = 20.0


class ClassicServer:
    """bench/classic_question_server.py in a subprocess on a free port."""

    def __init__(self) -> None:
        self.port, self.process = script_server("classic_question_server.py")
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    def answers(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/bench/answers", timeout=10) as response:
            return json.loads(response.read())

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def register_classic(classic: ClassicServer, user, samples: int):
    from stack_fixtures import in_own_thread

    from taskhub.servers.discovery import discover_and_record
    from taskhub.servers.services import create_server

    # Its held calls must not wait for one another: the server's share of the worker's slots fits them all.
    server = create_server(
        name="bench-classic", transport="http", url=classic.url, user=user, max_concurrent_jobs=samples + 1
    )
    in_own_thread(discover_and_record, server=server, user=user)
    return server


def open_requests(count: int) -> list[tuple[int, str, str]]:
    """Wait until `count` requests are open; (request id, kind, the key its arrival is stamped under)."""
    from django.db import connections

    from taskhub.tasks.models import InputRequest, InputRequestState

    deadline = time.monotonic() + 120
    while True:
        rows = list(
            InputRequest.objects.filter(state=InputRequestState.OPEN)
            .order_by("pk")
            .values_list("pk", "held_by", "task__remote_task_id", "task__arguments")
        )
        if len(rows) >= count:
            connections.close_all()
            return [
                (pk, "classic", arguments["tag"]) if held_by else (pk, "extension", remote_id)
                for pk, held_by, remote_id, arguments in rows
            ]
        if time.monotonic() > deadline:
            raise SystemExit(f"only {len(rows)} of {count} input requests opened within 120 s")
        time.sleep(0.3)


def alternate(requests: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    by_kind = {kind: [r for r in requests if r[1] == kind] for kind in ("extension", "classic")}
    pairs = zip(by_kind["extension"], by_kind["classic"], strict=True)
    return [request for pair in pairs for request in pair]


def browser_samples(context, base_url: str, arrivals, requests) -> tuple[dict[str, list[float]], int]:
    page = context.new_page()
    page.goto(f"{base_url}/inbox/")
    page.evaluate("performance.setResourceTimingBufferSize(100000)")
    wait_live(page)
    latencies: dict[str, list[float]] = {"extension": [], "classic": []}
    missing = 0
    for request_id, kind, key in requests:
        card = page.locator(f"#ir-{request_id}")
        card.get_by_label("Approve?").check()
        time.sleep(random.uniform(0.05, 0.2))
        before = page.evaluate("[window.__benchSubmits.length]")
        card.get_by_role("button", name="Accept").click()
        page.wait_for_function(f"window.__benchSubmits.length > {before[0]}")
        submitted = page.evaluate("window.__benchSubmits[window.__benchSubmits.length - 1][1]")
        page.wait_for_function(ANSWER_RESPONSE_JS, arg=f"/inbox/{request_id}/answer")
        deadline = time.monotonic() + 10
        while (arrived := arrivals[kind]().get(key)) is None:
            if time.monotonic() > deadline:
                print(f"  request {request_id} ({kind}): the answer did not arrive within 10 s", flush=True)
                missing += 1
                break
            time.sleep(0.01)
        if arrived is not None:
            latencies[kind].append(arrived * 1000 - submitted)
    return latencies, missing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=MAX_SAMPLES, help=f"answers of each kind (≤ {MAX_SAMPLES})")
    parser.add_argument("--database-url", default=os.environ.get("BENCH_CLASSIC_DATABASE_URL", DEFAULT_DATABASE_URL))
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--browser-cores", default="0", help=BROWSER_CORES_HELP)
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "RESULTS.md")
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to RESULTS.md")
    args = parser.parse_args()
    if not 1 <= args.samples <= MAX_SAMPLES:
        parser.error(f"--samples is 1 to {MAX_SAMPLES}: each classic question holds one of the worker's job slots")
    cores = browser_cores(args.browser_cores)

    command = "uv run python bench/classic_answer.py " + " ".join(sys.argv[1:])
    load_start = load()
    say(f"classic vs extension answer path: {args.samples} of each; machine shared (load {load_start})")
    prefix = f"benchclassic{os.getpid()}"
    env = prepare(args.database_url, args.redis_url, prefix)
    control, classic = ControlServer(), ClassicServer()
    try:
        from taskhub.tasks import services

        user = bench_user()
        extension_server = register(control, user, "bench-extension")
        classic_server = register_classic(classic, user, args.samples)
        seed(extension_server, user, "approval", control.create("approval", args.samples))
        with web_and_worker(env, f"bench-classic-{os.getpid()}") as (web, _worker):
            for index in range(args.samples):
                services.launch(server=classic_server, tool="ask", arguments={"tag": f"c{index}"}, user=user)
            say(f"daphne on {web.url}, worker running; waiting for the {2 * args.samples} questions")
            requests = alternate(open_requests(2 * args.samples))
            arrivals = {"extension": control.updates, "classic": classic.answers}
            with signed_in_browser(web.url, user, cores=cores) as context:
                latencies, missing = browser_samples(context, web.url, arrivals, requests)
    finally:
        control.stop()
        classic.stop()
        drop(args.database_url)

    extension, classic_figures = spread(latencies["extension"]), spread(latencies["classic"])
    gap = classic_figures["p50"] - extension["p50"]
    met = "yes" if gap <= GOAL_WITHIN_MS and not missing else "**no**"
    lines = [
        *results_header("Classic elicitation's answer path against the Tasks extension's", command, load_start),
        "- stack: daphne + one `manage.py worker` + Postgres (own database) + Redis channel layer "
        f"(prefix `{prefix}`), production settings; Debian's chromium (Playwright) on the inbox; "
        f"{browser_cores_said(cores)}",
        "- servers: bench/demo_control_server.py (`approval`: the extension's question, answered by `tasks/update` "
        "from the delivery job) and bench/classic_question_server.py (2025-06-18, `ask`: `elicitation/create` on the "
        "call's event stream, answered by the worker holding the call as the JSON-RPC response)",
        "- latency = the server's time.time() when the HTTP request with the answer reached it - the form's `submit` "
        f"event in the page; {args.samples} of each, alternately, one at a time",
        "",
        "| path | samples | p50 ms | p95 ms | max ms |",
        "|---|---:|---:|---:|---:|",
        f"| Tasks extension: submit → `tasks/update` | {extension['n']} | {extension['p50']:.1f} | "
        f"{extension['p95']:.1f} | {extension['max']:.1f} |",
        f"| classic: submit → the elicitation's response | {classic_figures['n']} | {classic_figures['p50']:.1f} | "
        f"{classic_figures['p95']:.1f} | {classic_figures['max']:.1f} |",
        "",
        f"classic p50 - extension p50: {gap:+.1f} ms (goal ≤ {GOAL_WITHIN_MS:.0f} ms: {met}); missing {missing}",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_record:
        append_results(args.results, text)


if __name__ == "__main__":
    main()
