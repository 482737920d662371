"""Per-step cost of profcallbacks outside capture windows, and the pause when a window ends.

Run: python benchmarks/overhead.py [--blocks 30 --steps 200]

Part 1 interleaves blocks of the same tiny training step (~0.5 ms on CPU) in one process:
  bare loop | StepProfiler outside windows (default options, and timing only: no detectors)
  | torch.profiler alive in its wait phase
and prints each variant's median throughput relative to the bare loop (goal: StepProfiler >= 0.99).
Part 2 times the training-thread pause at the end of a 5-step window: StepProfiler (stop, then
export on a background thread) against torch's own on_trace_ready export of the same window.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
from torch import nn

from profcallbacks import Schedule, StepProfiler


def make_step() -> Callable[[], None]:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64)

    def step() -> None:
        loss = model(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def timed_block(step: Callable[[], None], after: Callable[[], None] | None, n: int) -> float:
    start = time.perf_counter()
    if after is None:
        for _ in range(n):
            step()
    else:
        for _ in range(n):
            step()
            after()
    return n / (time.perf_counter() - start)


def overhead(blocks: int, steps: int) -> dict[str, float]:
    """Median over rounds of each variant's throughput divided by the same round's bare loop."""
    step = make_step()
    for _ in range(300):
        step()
    with tempfile.TemporaryDirectory() as logdir:
        profilers = {  # both open for the whole run, paused outside their own blocks
            "StepProfiler (defaults)": StepProfiler(f"{logdir}/a", schedule=None,
                                                    capture_on_slowdown=False),
            "StepProfiler (timing only)": StepProfiler(
                f"{logdir}/b", schedule=None, stall=None, slowdown=None, sync_audit=False),
        }
        alive = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(wait=10**9, warmup=1, active=1))
        variants: list[tuple[str, Callable[[], None] | None]] = [
            ("bare", None), *((name, p.step) for name, p in profilers.items()),
            ("torch.profiler (wait)", alive.step)]
        ratios: dict[str, list[float]] = {name: [] for name, _ in variants[1:]}
        with profilers["StepProfiler (defaults)"], profilers["StepProfiler (timing only)"], alive:
            for prof in profilers.values():
                prof.pause()
            for b in range(blocks):
                rates = {}
                shift = b % len(variants)  # rotate the order to spread drift
                for name, after in variants[shift:] + variants[:shift]:
                    prof = profilers.get(name)
                    if prof is not None:
                        prof.resume()
                    rates[name] = timed_block(step, after, steps)
                    if prof is not None:
                        prof.pause()
                for name in ratios:
                    ratios[name].append(rates[name] / rates["bare"])
    return {name: statistics.median(r) for name, r in ratios.items()}


def window_end_pause(repeats: int) -> dict[str, float]:
    step = make_step()
    ours, theirs = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as logdir:
            prof = StepProfiler(logdir, schedule=Schedule(skip_first=2, warmup=1, active=5),
                                tensorboard_scalars=False)
            with prof:
                for i in range(10):
                    step()
                    start = time.perf_counter()
                    prof.step()
                    if i == 7:  # the step() that closes the window (steps 3-7 recorded)
                        ours.append(time.perf_counter() - start)
        with tempfile.TemporaryDirectory() as logdir:
            handler = torch.profiler.tensorboard_trace_handler(logdir)
            p = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                with_modules=True, on_trace_ready=handler,
                schedule=torch.profiler.schedule(skip_first=2, wait=0, warmup=1, active=5, repeat=1))
            with p:
                for i in range(10):
                    step()
                    start = time.perf_counter()
                    p.step()
                    if i == 7:
                        theirs.append(time.perf_counter() - start)
    return {"StepProfiler": statistics.median(ours) * 1e3,
            "torch on_trace_ready export": statistics.median(theirs) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--blocks", type=int, default=90)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    step = make_step()
    start = time.perf_counter()
    for _ in range(200):
        step()
    print(f"tiny step: {(time.perf_counter() - start) / 200 * 1e3:.3f} ms")
    print(f"\nthroughput relative to the bare loop (median over {args.blocks} rounds of interleaved "
          f"{args.steps}-step blocks):")
    for name, ratio in overhead(args.blocks, args.steps).items():
        print(f"  {name:<28} {ratio:.4f}")
    print(f"\ntraining-thread pause at the end of a 5-step window (median of {args.repeats}):")
    for name, ms in window_end_pause(args.repeats).items():
        print(f"  {name:<28} {ms:8.1f} ms")


if __name__ == "__main__":
    main()
