"""Per-step cost of the Hugging Face ProfilerCallback outside capture windows.

Run: python benchmarks/hf_overhead.py [--rounds 10 --steps 200]

Alternates short ``Trainer.train()`` runs of the same tiny model in one process: without our
callback, and with ``ProfilerCallback`` at its default options but no scheduled window. A timing
callback, present in both, reads the clock at every ``on_step_end``; each run's median step time
is kept, and the ratio ``median(without) / median(with)`` is printed (goal: >= 0.99), with the
median of the per-round ratios (runs of a round are neighbours in time, so they share the load).
On a shared machine those ratios swing with other processes' load; the time spent inside the
callback's per-step hooks, also printed, is a load-independent estimate of the same cost.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import Trainer, TrainerCallback  # noqa: E402

from profcallbacks.hf import ProfilerCallback  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "hf_example", Path(__file__).resolve().parents[1] / "examples" / "hf_example.py")
assert _spec is not None and _spec.loader is not None
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)


class StepClock(TrainerCallback):
    """Clock reads at each optimizer step's end; steps are the gaps between them."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.ends.append(time.perf_counter())

    def median_step_ms(self, skip: int) -> float:
        gaps = [b - a for a, b in zip(self.ends[skip:], self.ends[skip + 1:], strict=False)]
        return statistics.median(gaps) * 1e3


class TimedProfilerCallback(ProfilerCallback):
    """ProfilerCallback with a clock around its per-step hooks: their own cost, immune to load."""

    hook_s = 0.0

    def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        super().on_step_begin(*args, **kwargs)
        TimedProfilerCallback.hook_s += time.perf_counter() - start

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        super().on_step_end(*args, **kwargs)
        TimedProfilerCallback.hook_s += time.perf_counter() - start


def one_run(workdir: str, steps: int, with_callback: bool, sync_audit: bool = True) -> float:
    clock = StepClock()
    callbacks: list[TrainerCallback] = [clock]
    if with_callback:
        # no scheduled window and none triggered by a slowdown: the cost outside windows
        callbacks.insert(0, TimedProfilerCallback(Path(workdir) / "prof", schedule=None,
                                                  capture_on_slowdown=False,
                                                  sync_audit=sync_audit))
    args = example.training_args(workdir, max_steps=steps, logging_strategy="no")
    torch.manual_seed(0)
    trainer = Trainer(model=example.TinyRegressor(), args=args,
                      train_dataset=example.SyntheticRegression(8 * steps), callbacks=callbacks)
    trainer.train()
    return clock.median_step_ms(skip=20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--no-sync-audit", action="store_true", help="sync_audit=False")
    parsed = parser.parse_args()
    torch.set_num_threads(1)
    medians: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as workdir:
        one_run(workdir, 50, True)  # warm imports and allocator
        TimedProfilerCallback.hook_s = 0.0
        for round_ in range(parsed.rounds):
            order = (False, True) if round_ % 2 == 0 else (True, False)
            for with_callback in order:
                medians[with_callback].append(
                    one_run(workdir, parsed.steps, with_callback, not parsed.no_sync_audit))
    bare, ours = statistics.median(medians[False]), statistics.median(medians[True])
    paired = statistics.median(a / b for a, b in zip(medians[False], medians[True], strict=True))
    print(f"median step time: no callback {bare:.3f} ms, ProfilerCallback outside windows "
          f"{ours:.3f} ms")
    print(f"per-run medians (ms): no callback {[round(m, 3) for m in medians[False]]}")
    print(f"                      callback    {[round(m, 3) for m in medians[True]]}")
    hook_ms = TimedProfilerCallback.hook_s * 1e3 / (parsed.rounds * parsed.steps)
    print(f"time inside the callback's step hooks: {hook_ms * 1e3:.1f} us per step = "
          f"{hook_ms / bare:.2%} of a {bare:.3f} ms step (ratio {bare / (bare + hook_ms):.4f})")
    print(f"throughput ratio (no callback time / callback time): {bare / ours:.4f}; median of "
          f"per-round ratios {paired:.4f}  (goal >= 0.99)")


if __name__ == "__main__":
    main()
