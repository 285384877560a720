"""The command line's start-up (issue 37 item 2): `python -m taskhub.mcp --help` against the bare interpreter's start
(`python -c pass`), a quick `call` against a bare SDK client script doing the same call, and six quick calls at once
against one alone, all measured in the same run; and as the floor of the last, six bare SDK clients and six bare
interpreters at once, each against one alone.

The server is the bundled demo (`python -m taskhub.demo --http`, tests/demo_process.py), its `quick` tool (an echo,
never a task). Each figure is the wall time of a whole process, from spawn to exit, `--runs` times, the kinds
interleaved so that drift in the machine's load hits all of them; p50 and max are given. The bare SDK client
(`SDK_CALL` below) imports `mcp.Client` and the Streamable HTTP transport and makes the same `tools/call`; the CLI
also lists the server's tools first (it checks the arguments against the tool's schema), as it always does.

    uv run python bench/cli_start.py                 # 10 runs of each (~2 min on a slow machine)
    uv run python bench/cli_start.py --runs 3 --no-record
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from livestack import append_results, load, results_header

ROOT = Path(__file__).resolve().parent.parent

GOAL_HELP = 10.0  # --help within 10x the bare interpreter's start-up
GOAL_CALL = 3.0  # a quick call within 3x a bare SDK client's
GOAL_CONCURRENT = 2.0  # six at once, each within 2x of one alone
CONCURRENT = 6

SDK_CALL = """
import asyncio, sys
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

async def main():
    async with Client(streamable_http_client(sys.argv[1])) as client:
        result = await client.call_tool("quick", {"text": "hi"})
        print(result.content[0].text)

asyncio.run(main())
"""


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    finished = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    elapsed = time.perf_counter() - started
    if finished.returncode != 0:
        raise SystemExit(f"{command[:4]} exited {finished.returncode}: {finished.stderr[-2000:]}")
    return elapsed


def timed_together(command: list[str], count: int) -> list[float]:
    started = time.perf_counter()
    processes = [
        subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT) for _ in range(count)
    ]
    ends = []
    for process in processes:
        _, stderr = process.communicate()
        if process.returncode != 0:
            raise SystemExit(f"a concurrent call exited {process.returncode}: {stderr.decode()[-2000:]}")
        ends.append(time.perf_counter() - started)
    return ends


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "RESULTS.md")
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to RESULTS.md")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.demo_process import DemoServer

    command = "uv run python bench/cli_start.py " + " ".join(sys.argv[1:])
    load_start = load()
    python = sys.executable
    samples: dict[str, list[float]] = {"pass": [], "help": [], "sdk": [], "cli": []}
    # Six at once: the CLI's call, and as baselines the bare SDK client's and the bare interpreter's (six processes
    # that only use the CPU, on two cores, cannot each finish within 2x of one alone: what they reach is the floor).
    together: dict[str, list[float]] = {"cli": [], "sdk": [], "pass": []}
    with DemoServer() as demo:
        kinds = {
            "pass": [python, "-c", "pass"],
            "help": [python, "-m", "taskhub.mcp", "--help"],
            "sdk": [python, "-c", SDK_CALL, demo.url],
            "cli": [python, "-m", "taskhub.mcp", "call", "--url", demo.url, "quick", "--args", '{"text": "hi"}'],
        }
        timed(kinds["cli"])  # warm the file cache and the demo server
        for run in range(args.runs):
            for kind, line in kinds.items():
                samples[kind].append(timed(line))
            print(f"run {run + 1}/{args.runs}: " + ", ".join(f"{k} {v[-1]:.3f}s" for k, v in samples.items()))
        for _ in range(max(1, args.runs // 3)):
            for kind in together:
                together[kind] += timed_together(kinds[kind], CONCURRENT)

    p50 = {kind: statistics.median(values) for kind, values in samples.items()}
    top = {kind: max(values) for kind, values in samples.items()}
    help_ratio, call_ratio = p50["help"] / p50["pass"], p50["cli"] / p50["sdk"]
    together_ratio = {kind: statistics.median(values) / p50[kind] for kind, values in together.items()}

    def met(ratio: float, goal: float) -> str:
        return "yes" if ratio <= goal else "**no**"

    lines = [
        *results_header("The CLI's start-up against the bare interpreter and a bare SDK client", command, load_start),
        "- server: the bundled demo over Streamable HTTP (tests/demo_process.py), its `quick` tool (an echo)",
        f"- wall time of whole processes, {args.runs} runs of each kind interleaved; six at once: "
        f"{len(together['cli']) // CONCURRENT} rounds",
        "",
        "| what | p50 s | max s | ratio | goal | met |",
        "|---|---:|---:|---:|---:|---|",
        f"| `python -c pass` (baseline) | {p50['pass']:.3f} | {top['pass']:.3f} | 1 | | |",
        f"| `python -m taskhub.mcp --help` | {p50['help']:.3f} | {top['help']:.3f} | {help_ratio:.1f}x pass | "
        f"≤ {GOAL_HELP:.0f}x | {met(help_ratio, GOAL_HELP)} |",
        f"| bare SDK client, one `tools/call` (baseline) | {p50['sdk']:.3f} | {top['sdk']:.3f} | 1 | | |",
        f"| `python -m taskhub.mcp call … quick` | {p50['cli']:.3f} | {top['cli']:.3f} | {call_ratio:.2f}x SDK | "
        f"≤ {GOAL_CALL:.0f}x | {met(call_ratio, GOAL_CALL)} |",
        f"| six `call`s at once, each | {statistics.median(together['cli']):.3f} | {max(together['cli']):.3f} | "
        f"{together_ratio['cli']:.2f}x one alone | ≤ {GOAL_CONCURRENT:.0f}x | "
        f"{met(together_ratio['cli'], GOAL_CONCURRENT)} |",
        f"| six bare SDK clients at once, each (baseline) | {statistics.median(together['sdk']):.3f} | "
        f"{max(together['sdk']):.3f} | {together_ratio['sdk']:.2f}x one alone | | |",
        f"| six `python -c pass` at once, each (baseline) | {statistics.median(together['pass']):.3f} | "
        f"{max(together['pass']):.3f} | {together_ratio['pass']:.2f}x one alone | | |",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_record:
        append_results(args.results, text)


if __name__ == "__main__":
    main()
