"""Freshness: time from a task's status change on the MCP server until a browser's DOM shows it (issue 6 item 2),
with polling and with `notifications/tasks`, against a bare SDK client on the same server in the same run.

The whole product in real processes (bench/livestack.py): daphne, one `manage.py worker`, Postgres (a database
of the benchmark's own), the Redis channel layer (prefix benchfresh<pid>), Debian's chromium through Playwright
(signed in as an operator). Two bench/demo_control_server.py processes (the bundled demo server plus a control
surface): one answers `subscriptions/listen` with -32601, so the worker polls its tasks (`tasks/get` every
pollIntervalMs); the other pushes `notifications/tasks` to the worker's subscription. Per mode, N held tasks are
launched (through the product's services) and followed by the worker; then one at a time: the browser opens the
task's detail page (live socket open, task watched), the server is told to complete the task (its `time.time()`
just before the change is the start), and a MutationObserver in the page stamps (performance.timeOrigin + now(),
the same wall clock) when the detail header's status becomes completed, and when the task list page (open in a
second tab, filtered to that server) shows the row completed. Same machine, same clock: no offset to correct.
Baselines (the floor), same run, same servers: one long-lived SDK `TasksClient` (taskhub.mcp.client) polling
`tasks/get` every pollIntervalMs, and one listening with `subscriptions/listen`; time from the change to the
client having it.

When polled, most of a change's freshness is the poll's phase: how long after a poll the change comes (up to one
interval, uniformly: ±90 ms at p50 over 30 samples, by chance alone). So each polled change comes at a moment
chosen after a poll of that task seen at the server (its `tasks/get` arrival), the same offsets (a fixed seed) for
the bare client and for taskhub: their p50s then differ by what each does with the poll, not by luck. The
breakdown also shows the poll that saw the change (its arrival at the server) and from it to the client or DOM.
Goals of issue 18: p50 ≤ 60 ms with notifications (detail page); polling p50 within 100 ms of the bare polling
client's in the same run.

The browser stands for the operator's own machine: Playwright's driver and Chromium are pinned to core 0
(--browser-cores; 'all' leaves them unpinned, as every run before 2026-12-02 19:30 did), taskhub's processes
keep both cores.

    uv run python bench/freshness.py                                  # 30 samples per mode, 1,000 ms (~4 min)
    uv run python bench/freshness.py --samples 5 --no-record          # a quick look

Postgres: --database-url (default $BENCH_FRESHNESS_DATABASE_URL or
postgres://postgres@127.0.0.1:5432/taskhub_bench_freshness), dropped and created by the benchmark.
Redis: --redis-url (default redis://127.0.0.1:6379/0).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from pathlib import Path

from livestack import (
    BROWSER_CORES_HELP,
    ROOT,
    ControlServer,
    bench_user,
    browser_cores,
    browser_cores_said,
    drop,
    load,
    ms,
    prepare,
    profiled,
    register,
    results_header,
    say,
    seed,
    signed_in_browser,
    spread,
    wait_live,
    web_and_worker,
)

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/taskhub_bench_freshness"
GOAL_NOTIFIED_P50_MS = 60.0  # issue 18 item 2, detail page
GOAL_POLLING_ABOVE_FLOOR_MS = 100.0  # issue 18 item 2: polling p50 within this of the bare polling client's
PHASE_SEED = 18


LIST_ROWS = 50  # the task list's page: PAGE_SIZE of taskhub/tasks/views/listing.py


def poll_phases(samples: int, interval_ms: int) -> list[float]:
    """Seconds after a poll at which each polled change comes: uniform over the interval, the same every run."""
    rng = random.Random(PHASE_SEED)
    return [rng.uniform(0.05, interval_ms / 1000 - 0.05) for _ in range(samples)]


def change_after_a_poll(control: ControlServer, task_id: str, phase: float) -> float:
    """Complete the task `phase` seconds after the next `tasks/get` of it reaches the server; the change's time."""
    polled_at = control.next_poll(task_id, after=time.time())
    if polled_at is None:
        raise SystemExit(f"task {task_id} was not polled within 10 s")
    time.sleep(max(0.0, polled_at + phase - time.time()))
    return control.finish(task_id)


def seen_by_poll(polls: dict[str, list[float]], task_id: str, changed: float) -> float | None:
    """The arrival of the first `tasks/get` of the task after its change: the poll that saw it."""
    return min((at for at in polls.get(task_id, []) if at > changed), default=None)


PHASE_SPAN = "change → the poll that saw it (its phase)"
GAP_SPAN = "the poll before the change → the poll that saw it (the gap between polls)"


def poll_spans(changes: dict[str, tuple], polls: dict[str, list[float]], labels: list[str]) -> dict[str, list[float]]:
    """By remote task id, (change, then the moment each of `labels` had it): the gap between the poll before the
    change and the poll that saw it, change → that poll, and that poll → each of them."""
    spans: dict[str, list[float]] = {
        GAP_SPAN: [],
        PHASE_SPAN: [],
        **{f"that poll → {label}": [] for label in labels},
    }
    for task_id, (changed, *seen) in changes.items():
        if (poll := seen_by_poll(polls, task_id, changed)) is None:
            continue
        if (before := max((at for at in polls.get(task_id, []) if at <= changed), default=None)) is not None:
            spans[GAP_SPAN].append(ms(poll - before))
        spans[PHASE_SPAN].append(ms(poll - changed))
        for label, at in zip(labels, seen, strict=True):
            spans[f"that poll → {label}"].append(ms(at - poll))
    return spans


# --- the floor: a bare SDK client on the same server ----------------------------------------------------------


async def floor_polling(control: ControlServer, samples: int, interval_ms: int) -> tuple[list[float], dict]:
    """One TasksClient polling a held task every interval; each change at its phase after a poll (poll_phases);
    change → the client has it. Also {task id: (change, client has it)}."""
    from taskhub.mcp.client import HttpTarget, TasksClient

    latencies, moments = [], {}
    async with TasksClient(HttpTarget(url=control.url)) as client:
        for wire, phase in zip(control.create("bench_hold", samples), poll_phases(samples, interval_ms), strict=True):
            task_id = wire["taskId"]
            seen = asyncio.get_running_loop().create_future()

            async def poll(task_id=task_id, seen=seen) -> None:
                while True:
                    snapshot = await client.get_task(task_id)
                    if snapshot.status == "completed":
                        seen.set_result(time.time())
                        return
                    await asyncio.sleep(interval_ms / 1000)

            poller = asyncio.create_task(poll())
            await asyncio.sleep(random.uniform(0.05, interval_ms / 1000))  # polling for a while already
            changed = await asyncio.to_thread(change_after_a_poll, control, task_id, phase)
            had = await asyncio.wait_for(seen, 10)
            latencies.append(ms(had - changed))
            moments[task_id] = (changed, had)
            await poller
    return latencies, moments


async def floor_notified(control: ControlServer, samples: int) -> list[float]:
    """One TasksClient listening to a held task; change → its `notifications/tasks` received."""
    from taskhub.mcp.client import HttpTarget, TasksClient

    latencies = []
    async with TasksClient(HttpTarget(url=control.url)) as client:
        for wire in control.create("bench_hold", samples):
            async with client.listen([wire["taskId"]]) as subscription:
                notes = aiter(subscription)
                await anext(notes)  # the current state, sent first
                await asyncio.sleep(random.uniform(0.05, 0.2))
                changed = await asyncio.to_thread(control.finish, wire["taskId"])
                while (await asyncio.wait_for(anext(notes), 10)).status != "completed":
                    pass
                latencies.append(ms(time.time() - changed))
    return latencies


# --- taskhub: the browser ----------------------------------------------------------------------------------


def browser_samples(
    context, base_url: str, control: ControlServer, server_id: int, seeded: dict, pause_s: tuple, phases: list | None
):
    """Per task: open its detail page, complete it on the server (`phases`: each at its phase after a poll; else
    after a pause in `pause_s`), stamp when the detail header and the list row show it. Returns (detail latencies,
    list latencies, missing count, {task id: (change, frame, detail seen, list seen) in s})."""
    listing = context.new_page()
    listing.goto(f"{base_url}/tasks/?server={server_id}")
    wait_live(listing)
    detail = context.new_page()
    detail_ms, list_ms, missing, moments = [], [], 0, {}
    for n, (remote_id, task_id) in enumerate(seeded.items()):
        detail.goto(f"{base_url}/tasks/{task_id}/")
        wait_live(detail, messages=2)  # the nav counts on connect, then the watched task's sections
        header, row = f"task-{task_id}-header", f"task-row-{task_id}"
        detail.evaluate(f"window.__benchExpect('{header}', 'status-edge-completed')")
        listing.evaluate(f"window.__benchExpect('{row}', 'row-completed')")
        if phases is not None:
            changed = change_after_a_poll(control, remote_id, phases[n])
        else:
            time.sleep(random.uniform(*pause_s))
            changed = control.finish(remote_id)
        try:
            detail.wait_for_function(f"window.__benchSeen['{header}'] !== undefined", timeout=10_000)
            listing.wait_for_function(f"window.__benchSeen['{row}'] !== undefined", timeout=10_000)
        except Exception as error:  # a sample that never shows is counted, not fatal
            print(f"  task {task_id}: not seen within 10 s ({type(error).__name__})", flush=True)
            missing += 1
            continue
        detail_seen = detail.evaluate(f"window.__benchSeen['{header}']") / 1000
        frame = detail.evaluate(f"window.__benchFrameBefore({detail_seen * 1000})") / 1000
        list_seen = listing.evaluate(f"window.__benchSeen['{row}']") / 1000
        detail_ms.append(ms(detail_seen - changed))
        list_ms.append(ms(list_seen - changed))
        moments[task_id] = (changed, frame, detail_seen, list_seen)
    return detail_ms, list_ms, missing, moments


def stages(moments: dict, polls: dict[str, list[float]] | None = None, seeded: dict | None = None):
    """Where the time went: the change stored by the worker (the task's finished_at, set by apply_snapshot in its
    transaction), then the pages showing it (publish, channel layer, daphne rendering, socket, htmx swap). Polled
    (`polls` and `seeded`, by remote task id): first the poll that saw the change."""
    from taskhub.tasks.models import Task

    stored = dict(Task.objects.filter(pk__in=list(moments)).values_list("pk", "finished_at"))
    polled: dict[str, list[float]] = {}
    if polls is not None:
        changes = {
            remote_id: (moments[task_id][0], stored[task_id].timestamp(), moments[task_id][2])
            for remote_id, task_id in seeded.items()
            if task_id in moments and stored.get(task_id) is not None
        }
        polled = poll_spans(changes, polls, ["stored (the tracker's request, apply_snapshot)", "detail page"])
    spans: dict[str, list[float]] = {
        "change → stored": [],
        "stored → detail page's socket frame (publish, Redis, daphne renders, sends)": [],
        "detail page's socket frame → DOM (htmx swaps)": [],
        "stored → detail page": [],
        "stored → list page (the signal with the row; before a1bc4db: signal, table re-fetch)": [],
    }
    names = list(spans)
    for task_id, (changed, frame, detail_seen, list_seen) in moments.items():
        if stored.get(task_id) is None:
            continue
        at = stored[task_id].timestamp()
        for name, value in zip(
            names, (at - changed, frame - at, detail_seen - frame, detail_seen - at, list_seen - at), strict=False
        ):
            spans[name].append(ms(value))
    return polled | spans


def wait_until(check, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=30, help="changes per mode (and per baseline), at most 50")
    parser.add_argument("--poll-interval-ms", type=int, default=1000, help="the servers' pollIntervalMs")
    parser.add_argument("--database-url", default=os.environ.get("BENCH_FRESHNESS_DATABASE_URL", DEFAULT_DATABASE_URL))
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--browser-cores", default="0", help=BROWSER_CORES_HELP)
    parser.add_argument(
        "--profile", default="", help="py-spy daphne and the worker during the notifications phase: PREFIX-*.txt"
    )
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "RESULTS.md")
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to RESULTS.md")
    args = parser.parse_args()
    if not 1 <= args.samples <= LIST_ROWS:
        # Each change is watched on one list page too: a task past its first page never shows there (each counted
        # missing after 10 s).
        parser.error(f"--samples: 1 to {LIST_ROWS}, the rows of the task list's first page")
    cores = browser_cores(args.browser_cores)

    command = "uv run python bench/freshness.py " + " ".join(sys.argv[1:])
    load_start = load()
    interval = args.poll_interval_ms
    say(f"freshness: {args.samples} changes per mode, pollIntervalMs {interval}; machine shared (load {load_start})")
    prefix = f"benchfresh{os.getpid()}"
    env = prepare(args.database_url, args.redis_url, prefix)
    polled = ControlServer("--poll-interval-ms", str(interval), "--no-listen")
    pushed = ControlServer("--poll-interval-ms", str(interval))
    results: dict[str, dict] = {}
    try:
        say("baselines: a bare SDK client polling, then listening")
        floor_latencies, floor_moments = asyncio.run(floor_polling(polled, args.samples, interval))
        results["SDK client polling (floor)"] = {"latency": floor_latencies}
        results["SDK client listening (floor)"] = {"latency": asyncio.run(floor_notified(pushed, args.samples))}
        for name, result in results.items():
            say(f"{name}: p50 {spread(result['latency'])['p50']:.1f} ms")

        user = bench_user()
        modes = {}
        for mode, control in (("polling", polled), ("notifications", pushed)):
            server = register(control, user, f"bench-{mode}")
            held = control.create("bench_hold", args.samples)
            # Launched as the listed tool `long` (launch refuses a tool the catalogue lacks; bench_hold is not
            # listed): the server's answer is the held task, which is what the tracker follows.
            modes[mode] = (control, server.pk, seed(server, user, "long", held))
        from django.db import connections

        connections.close_all()
        moments: dict[str, dict] = {}
        profiles: list[str] = []
        with web_and_worker(env, f"bench-fresh-{os.getpid()}") as (web, worker):
            say(f"daphne on {web.url}, worker running; waiting for the worker to subscribe to the pushed tasks")
            pushed_tasks = modes["notifications"][2]
            wait_until(lambda: all(pushed.watched(remote) for remote in pushed_tasks), "the worker's subscriptions")
            with signed_in_browser(web.url, user, cores=cores) as context:
                for mode, (control, server_id, seeded) in modes.items():
                    say(f"taskhub, {mode}: {len(seeded)} changes")
                    # After the page is live, the change comes at a random moment: over one poll interval when
                    # polled; 0.5-1 s on when pushed, so that the page's own loading is over (not what is measured).
                    pause = (0.05, interval / 1000) if mode == "polling" else (0.5, 1.0)
                    spied = {"daphne": web.process.pid, "worker": worker.pid} if mode == "notifications" else {}
                    phases = poll_phases(len(seeded), interval) if mode == "polling" else None
                    with profiled(spied, args.profile if spied else "") as files:
                        detail_ms, list_ms, missing, moments[mode] = browser_samples(
                            context, web.url, control, server_id, seeded, pause, phases
                        )
                    profiles += files
                    results[f"taskhub {mode}, detail page"] = {"latency": detail_ms, "missing": missing}
                    results[f"taskhub {mode}, list page"] = {"latency": list_ms, "missing": missing}
                    say(
                        f"taskhub {mode}: detail p50 {spread(detail_ms)['p50']:.1f} ms, list p50 "
                        f"{spread(list_ms)['p50']:.0f} ms, missing {missing}"
                    )
        polls = polled.polls()
        breakdown = {
            "polling, SDK client (floor)": poll_spans(floor_moments, polls, ["the client has it"]),
            "polling": stages(moments["polling"], polls, modes["polling"][2]),
            "notifications": stages(moments["notifications"]),
        }
    finally:
        polled.stop()
        pushed.stop()
        drop(args.database_url)

    floors = {
        "polling": spread(results["SDK client polling (floor)"]["latency"])["p50"],
        "notifications": spread(results["SDK client listening (floor)"]["latency"])["p50"],
    }
    goals = {
        "polling": floors["polling"] + GOAL_POLLING_ABOVE_FLOOR_MS,
        "notifications": GOAL_NOTIFIED_P50_MS,
    }
    lines = [
        *results_header("Freshness", command, load_start),
        "- stack: daphne + one `manage.py worker` + Postgres (own database) + Redis channel layer "
        f"(prefix `{prefix}`), production settings (DEBUG off, static files collected); "
        "Debian's chromium (Playwright) signed in as an operator; servers: two "
        f"bench/demo_control_server.py (the demo server, pollIntervalMs {interval}), one answering "
        "`subscriptions/listen` with -32601 (the worker polls), one pushing `notifications/tasks`; "
        f"{browser_cores_said(cores)}",
        f"- latency = the DOM shows `completed` (MutationObserver, performance.timeOrigin + now()) - the server's "
        f"time.time() just before the change; {args.samples} changes per mode, one at a time, each on a freshly "
        "opened detail page (socket open, task watched), and on a list page filtered to the server in a second tab; "
        "when pushed, the change 0.5-1 s after the page is live; when polled, at a phase after a poll of the task "
        f"(its `tasks/get` at the server): the same {args.samples} phases, uniform over the interval (seed "
        f"{PHASE_SEED}), for the bare client and for taskhub",
        "- floor: a long-lived SDK `TasksClient` polling `tasks/get` every pollIntervalMs, and one listening with "
        "`subscriptions/listen`: change → the client has it. Goals (issue 18): notifications ≤ "
        f"{GOAL_NOTIFIED_P50_MS:.0f} ms (the detail page); polling within {GOAL_POLLING_ABOVE_FLOOR_MS:.0f} ms of "
        "the polling floor's p50",
        "",
        "| path | samples | p50 ms | p95 ms | max ms | missing | p50 / floor p50 | goal (p50) |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, result in results.items():
        figures = spread(result["latency"])
        mode = "polling" if "polling" in name else "notifications"
        ratio = "1.0" if "floor" in name else f"{figures['p50'] / floors[mode]:.1f}x"
        goal = ""
        if "taskhub" in name and (mode == "polling" or "detail" in name):
            met = figures["p50"] <= goals[mode] and not result.get("missing")
            goal = f"≤ {goals[mode]:.0f} ms: {'yes' if met else '**no**'}"
        lines.append(
            f"| {name} | {figures['n']} | {figures['p50']:.1f} | {figures['p95']:.1f} | {figures['max']:.1f} | "
            f"{result.get('missing', 0)} | {ratio} | {goal} |"
        )
    lines += [
        "",
        "where the time goes (stored = the task's finished_at, written by the worker's apply_snapshot; a poll's time "
        "is its `tasks/get` reaching the server):",
        "",
    ]
    lines += ["| mode | stage | p50 ms | p95 ms |", "|---|---|---:|---:|"]
    for mode, spans in breakdown.items():
        for name, values in spans.items():
            figures = spread(values)
            lines.append(f"| {mode} | {name} | {figures['p50']:.1f} | {figures['p95']:.1f} |")
    lines.append("")
    text = "\n".join(lines)
    print(text)
    if not args.no_record:
        from livestack import append_results

        append_results(args.results, text)


if __name__ == "__main__":
    main()
