"""Publish → a web process's hub: when the copies of one task change reach a hub that is in all three of its groups
(the task's own group, the task list's, the inbox's), through the real Redis channel layer, by the order they are sent.

A page that shows the task (its detail page) and the gateway's waits are in the task's own group, and a hub hands them
the change with its first copy, whichever group that copy came through (taskhub/live/hub.py). So what a watcher waits
for is the first copy; the list pages and the inbox wait for theirs. Two orders, alternating change by change:
- "all at once": the three `group_send`s started together (taskhub before 2026-12-07: asyncio.gather);
- "one after the other, own group first": taskhub/live/publish.py as it is.

The sender is this process, publishing as a worker does (publish._send_to_groups from a thread without a loop, on the
process's publisher loop); the receiver is a second process standing for a daphne's hub: one channel in the three
groups, stamping each copy as `layer.receive` returns it (time.time(): same machine, same clock). Redis: --redis-url,
keys under a prefix of the benchmark's own.

    uv run python bench/publish.py                       # 400 changes per order (~30 s)
    uv run python bench/publish.py --changes 100         # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SERVER_ID = 1
ORDERS = ("all at once", "one after the other, own group first")


def configure(redis_url: str, prefix: str) -> None:
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "taskhub.settings",
            "SECRET_KEY": "bench-publish-not-secret",
            "REDIS_URL": redis_url,
            "REDIS_CHANNEL_PREFIX": prefix,
        }
    )
    import django

    django.setup()


def receive(redis_url: str, prefix: str, task_ids: list[str]) -> None:
    """The receiving process: one channel in every change's three groups; prints a line per copy received."""
    configure(redis_url, prefix)
    from channels.layers import get_channel_layer

    from taskhub.live.groups import TASKS_GROUP, inbox_group, task_group

    async def main() -> None:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        for group in [TASKS_GROUP, inbox_group(SERVER_ID), *(task_group(task_id) for task_id in task_ids)]:
            await layer.group_add(group, channel)
        print("ready", flush=True)
        while True:
            message = await layer.receive(channel)
            at = time.time()
            print(json.dumps({"at": at, "id": message["message_id"], "group": message["group"]}), flush=True)

    asyncio.run(main())


def send_all_at_once(groups: list[str], message: dict) -> None:
    """publish._send_to_groups before 2026-12-07: the three group_sends started together."""
    from channels.layers import get_channel_layer

    from taskhub.live import publish

    layer = get_channel_layer()

    async def send_all() -> None:
        await asyncio.gather(*(layer.group_send(group, {**message, "group": group}) for group in groups))

    asyncio.run_coroutine_threadsafe(send_all(), publish._publisher_loop()).result(timeout=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=400, help="changes per order")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "RESULTS.md")
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to RESULTS.md")
    parser.add_argument("--receive", nargs="*", help=argparse.SUPPRESS)  # the receiving process
    parser.add_argument("--prefix", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.receive is not None:
        receive(args.redis_url, args.prefix, args.receive)
        return

    from livestack import append_results, load, ms, results_header, say, spread

    load_start = load()
    prefix = f"benchpublish{os.getpid()}"
    configure(args.redis_url, prefix)
    from taskhub.live import publish

    task_ids = [str(uuid.uuid4()) for _ in range(args.changes * len(ORDERS))]
    receiver = subprocess.Popen(
        [sys.executable, __file__, "--redis-url", args.redis_url, "--prefix", prefix, "--receive", *task_ids],
        stdout=subprocess.PIPE,
        text=True,
    )
    copies: dict[str, dict[str, float]] = {}
    sent: dict[str, tuple[str, float, str]] = {}
    try:
        assert receiver.stdout is not None
        if receiver.stdout.readline().strip() != "ready":
            raise SystemExit("the receiving process did not start")
        say(f"publish: {args.changes} changes per order, alternating; machine shared (load {load_start})")
        for n, task_id in enumerate(task_ids):
            order = ORDERS[n % len(ORDERS)]
            groups = publish._audience(uuid.UUID(task_id), server_id=SERVER_ID, asks=True)
            message = {
                "type": publish.TASK_CHANGED,
                "task_id": task_id,
                "message_id": uuid.uuid4().hex,
                "server_id": SERVER_ID,
            }
            started = time.time()
            if order == "all at once":
                send_all_at_once(groups, message)
            else:
                publish._send_to_groups(groups, message)
            sent[message["message_id"]] = (order, started, task_id)
            for _ in groups:
                copy = json.loads(receiver.stdout.readline())
                copies.setdefault(copy["id"], {})[copy["group"]] = copy["at"]
            time.sleep(0.01)  # changes apart, as a worker's are
    finally:
        receiver.kill()
        receiver.wait()

    from taskhub.live.groups import TASKS_GROUP, task_group

    copy_names = ("own group's copy", "first copy", "list's copy", "last copy")
    figures: dict[str, dict[str, list[float]]] = {order: {name: [] for name in copy_names} for order in ORDERS}
    for message_id, (order, started, task_id) in sent.items():
        at = copies[message_id]
        figures[order]["own group's copy"].append(ms(at[task_group(uuid.UUID(task_id))] - started))
        figures[order]["first copy"].append(ms(min(at.values()) - started))
        figures[order]["list's copy"].append(ms(at[TASKS_GROUP] - started))
        figures[order]["last copy"].append(ms(max(at.values()) - started))
    lines = results_header(
        "Publish: a change's three copies to a hub, by the order they are sent",
        "uv run python bench/publish.py " + " ".join(sys.argv[1:]),
        load_start,
    )
    lines += [
        f"- {args.changes} changes per order, alternating; from the publish called (a thread without a loop, as a "
        "worker's commit hook) to each copy received by a second process in the three groups",
        "",
        "| order | copy | p50 ms | p95 ms | max ms |",
        "|---|---|---|---|---|",
    ]
    for order, spans in figures.items():
        for name, values in spans.items():
            figure = spread(values)
            lines.append(f"| {order} | {name} | {figure['p50']:.2f} | {figure['p95']:.2f} | {figure['max']:.2f} |")
    before, after = (spread(figures[order]["own group's copy"])["p50"] for order in ORDERS)
    lines += ["", f"- the own group's copy (what a watching page waits for): p50 {after:.2f} ms against {before:.2f}"]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_record:
        append_results(args.results, text)


if __name__ == "__main__":
    main()
