"""How a long-running taskhub process (daphne, `manage.py worker`) tunes Python itself once it has started."""

import gc

# With the default thresholds (700, 10, 10) the cyclic collector ran young collections dozens of times per change
# pushed to 1,000 sockets of a daphne, each traversing what the sockets hold, and in the worker it traversed the
# whole start-up heap (Django, the SDK, pydantic's models: ~200,000 objects) in each full collection, 100-180 ms
# with every poll and job waiting. bench/fanout.py (2,000 sockets over two daphnes): p99 1,392 -> 364 ms, 0.70 ->
# 0.38 daphne CPU-s per change; bench/tracker.py (5,000 tasks @ 1 s): see bench/RESULTS.md, session 15.
GC_YOUNG_THRESHOLD = 50_000


def tune_garbage_collector() -> None:
    """Freeze what the process loaded at start (it lives as long as the process: never traversed again) and let
    the young generation grow before a collection. Garbage in cycles is still collected, less often."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
