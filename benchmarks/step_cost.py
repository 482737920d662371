"""A HOT-CACHE LOWER BOUND on the cost of one ``prof.step()``; not the cost in training.

Run: python benchmarks/step_cost.py

It calls ``prof.step()`` thousands of times in a tight loop, where the code and its data stay in
the CPU caches; between real training work they do not, and per-step Python costs several times
more. The in-situ cost is what ``benchmarks/overhead.py`` measures; quote that one.

Best of 7 repeats of 2,000 calls after 100 warm-up steps of 0.5 ms (so the detectors have a
baseline and the sync audit is done): a load-robust number to set against a step's duration.
"""

from __future__ import annotations

import logging
import tempfile
import time
import timeit
from typing import Any

from profcallbacks import StepProfiler


def cost_us(**options: Any) -> float:
    with tempfile.TemporaryDirectory() as logdir:
        prof = StepProfiler(logdir, schedule=None, capture_on_slowdown=False, **options)
        with prof:
            for _ in range(100):
                time.sleep(0.0005)
                prof.step()
            best = min(timeit.repeat(prof.step, number=2000, repeat=7))
    return best / 2000 * 1e6


def main() -> None:
    logging.disable(logging.WARNING)
    timing_only: dict[str, Any] = dict(stall=None, slowdown=None, sync_audit=False)
    for name, options in [("defaults", {}), ("timing only", timing_only),
                          ("timing only, no TensorBoard or CAPTURE file",
                           {**timing_only, "tensorboard_scalars": False,
                            "watch_capture_file": False})]:
        us = cost_us(**options)
        print(f"{name:<46} {us:6.2f} us/step (hot-cache lower bound; see overhead.py)")


if __name__ == "__main__":
    main()
