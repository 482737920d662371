"""Cost of the memory numbers and of the memory capture's allocation spy.

Run: python benchmarks/memory_cost.py

1. One memory sample (``/proc/self/statm``; on CUDA also the allocator's counters), taken once per
   step summary (50 steps) and at most once a second: median of 2,000 samples.
2. ``prof.step()`` outside capture windows with memory off, on (default) and sampling at every
   summary: best of 7 repeats of 2,000 calls, as in ``step_cost.py``.
3. A small training step bare and under ``MemorySiteSpy`` (the few steps of a memory capture).
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import time
import timeit
from pathlib import Path

import torch

from profcallbacks import MemoryConfig, StepProfiler
from profcallbacks.detect.memory_sites import MemorySiteSpy
from profcallbacks.run.memory_monitor import MemoryMonitor


def sample_us() -> float:
    monitor = MemoryMonitor(MemoryConfig(sample_every_s=0), Path(tempfile.mkdtemp()), rank=0)
    times = []
    for step in range(2000):
        start = time.perf_counter()
        monitor.sample(step, 0.0)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def step_us(memory: MemoryConfig | None) -> float:
    with tempfile.TemporaryDirectory() as logdir:
        prof = StepProfiler(logdir, schedule=None, stall=None, slowdown=None, sync_audit=False,
                            memory=memory)
        with prof:
            for _ in range(100):
                time.sleep(0.0005)
                prof.step()
            best = min(timeit.repeat(prof.step, number=2000, repeat=7))
    return best / 2000 * 1e6


def spy_ms() -> tuple[float, float]:
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256)

    def train_step() -> None:
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    bare = min(timeit.repeat(train_step, number=50, repeat=5)) / 50 * 1e3
    with MemorySiteSpy():
        spied = min(timeit.repeat(train_step, number=50, repeat=5)) / 50 * 1e3
    return bare, spied


def main() -> None:
    logging.disable(logging.WARNING)
    print(f"one memory sample: {sample_us():.1f} us (once per 50 steps and at most once a second)")
    for name, memory in [("memory off", None), ("memory on (default)", MemoryConfig()),
                         ("memory, sample_every_s=0", MemoryConfig(sample_every_s=0))]:
        print(f"prof.step(), {name:<26} {step_us(memory):6.2f} us/step")
    bare, spied = spy_ms()
    print(f"training step bare {bare:.3f} ms, under the memory capture's spy {spied:.3f} ms "
          f"({spied / bare:.2f}x, only for the capture's steps)")


if __name__ == "__main__":
    main()
