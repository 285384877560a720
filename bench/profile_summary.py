"""Summarise a py-spy raw (collapsed stacks) profile: the functions with the most samples, own and inclusive.

uv run python bench/profile_summary.py /tmp/profile.txt [--top 30] [--match taskhub]
"""

from __future__ import annotations

import argparse
from collections import Counter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--match", default="", help="inclusive list: only frames containing this")
    options = parser.parse_args()
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    with open(options.path) as profile:
        for line in profile:
            stack, _, count = line.rstrip().rpartition(" ")
            if not stack:
                continue
            samples = int(count)
            total += samples
            frames = stack.split(";")
            own[frames[-1]] += samples
            for frame in set(frames):
                inclusive[frame] += samples
    print(f"{total} samples\n-- own")
    for frame, samples in own.most_common(options.top):
        print(f"{samples / total:6.1%}  {frame[:140]}")
    print("-- inclusive")
    shown = [(frame, samples) for frame, samples in inclusive.most_common() if options.match in frame]
    for frame, samples in shown[: options.top]:
        print(f"{samples / total:6.1%}  {frame[:140]}")


if __name__ == "__main__":
    main()
