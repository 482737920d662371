"""Real loops for the stall detector's wall-time hold: a steady loop beside a bursty co-tenant,
and a loader that waits about half of each step.

- ``steady_run``: ~4 ms steps (an MLP with Adam) fed by an in-memory DataLoader whose batches are
  collated from 32 samples on the training thread (~5-10% of step time waiting for data): no data
  problem. ``CoTenant`` loads every core in bursts meanwhile (a busy loop of 0.1-0.3 s, then
  0.3-1 s off, in a process per core), as a job compiling beside training does.
- ``half_wait_run``: the same step fed by a loader that sleeps about as long as the step computes
  (a 50% data wait from the first step on).

``tests/test_stall_hold.py`` asserts on them; ``benchmarks/stall_cotenant.py`` counts false stalls
over many runs and measures how soon the real wait is flagged.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

from profcallbacks import StepProfiler
from profcallbacks.findings import DATALOADER_STALL, Finding

BURSTS = """\
import os, random, sys, time
core, seed, on_lo, on_hi, off_lo, off_hi = sys.argv[1:]
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {int(core)})
rng = random.Random(int(seed))
while True:
    end = time.perf_counter() + rng.uniform(float(on_lo), float(on_hi))
    while time.perf_counter() < end:
        pass
    time.sleep(rng.uniform(float(off_lo), float(off_hi)))
"""


class CoTenant:
    """A busy loop in bursts on each core (a process per core) while the ``with`` block runs.

    Args:
        seed: Seeds each process's burst lengths (core ``c`` uses ``seed + c``).
        on_s: Range of a burst's length, in seconds.
        off_s: Range of the pause after each burst, in seconds.
    """

    def __init__(self, seed: int = 0, on_s: tuple[float, float] = (0.1, 0.3),
                 off_s: tuple[float, float] = (0.3, 1.0)) -> None:
        self.seed, self.on_s, self.off_s = seed, on_s, off_s
        self._procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> CoTenant:
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [
            *range(os.cpu_count() or 1)]
        for core in cores:
            self._procs.append(subprocess.Popen(
                [sys.executable, "-c", BURSTS, str(core), str(self.seed + core),
                 *map(str, (*self.on_s, *self.off_s))]))
        time.sleep(0.2)  # they are running
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self._procs:
            proc.kill()
        for proc in self._procs:
            proc.wait()
        self._procs.clear()


class Samples(Dataset[torch.Tensor]):
    """In-memory samples: a batch of 32 is collated on the training thread (~0.3 ms)."""

    def __init__(self, width: int) -> None:
        self.data = torch.randn(1024, width)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i]


class SleepyBatches(IterableDataset[torch.Tensor]):
    """Batches that take ``delay_s`` each to arrive (a sleep: an I/O-bound loader)."""

    def __init__(self, width: int, delay_s: float) -> None:
        self.batch, self.delay_s = torch.randn(32, width), delay_s

    def __iter__(self) -> Iterator[torch.Tensor]:
        while True:
            time.sleep(self.delay_s)
            yield self.batch


def make_step(width: int) -> Callable[[torch.Tensor], None]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step(x: torch.Tensor) -> None:
        loss = model(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def median_step_s(step: Callable[[torch.Tensor], None], x: torch.Tensor, runs: int) -> float:
    """The median time of ``runs`` steps on ``x``, after five to warm up."""
    for _ in range(5):
        step(x)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        step(x)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def calibrate(target_s: float = 0.004, batch: int = 32) -> int:
    """The MLP width whose step takes about ``target_s`` alone on this machine."""
    width, best = 64, (float("inf"), 64)
    while width <= 4096:
        t = median_step_s(make_step(width), torch.randn(batch, width), 15)
        best = min(best, (abs(t / target_s - 1) if t > target_s else abs(target_s / t - 1), width))
        if t > 2 * target_s:
            break
        width = int(width * 1.25)
    return best[1]


@dataclass
class LoopRun:
    """What one run gave: findings, each step's wall time and data wait (seconds)."""

    findings: list[Finding]
    times: list[float] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)

    def stalls(self) -> list[Finding]:
        return [f for f in self.findings if f.kind == DATALOADER_STALL]

    def elapsed_s(self, step: int) -> float:
        """Wall seconds from the first step's start to the end of ``step``."""
        return sum(self.times[:step + 1])


def run_loop(logdir: Path, loader: Any, step: Callable[[torch.Tensor], None], seconds: float,
             *, stop_at_stall: bool = False, **options: Any) -> LoopRun:
    """Steps for ``seconds`` of wall time with the default stall detector (and ``options``)."""
    options = {"schedule": None, "tensorboard_scalars": False, "slowdown": None,
               "sync_audit": False, "watch_capture_file": False, "memory": None, **options}
    prof = StepProfiler(logdir, **options)
    out = LoopRun([])
    clock = time.perf_counter
    end = clock() + seconds
    with prof:
        last = clock()
        while last < end:
            fetch_s = 0.0
            for x in prof.wrap(loader):
                fetch_s = clock() - last
                step(x)
                prof.step()
                now = clock()
                out.times.append(now - last)
                out.waits.append(fetch_s)
                last = now
                if now >= end or (stop_at_stall and any(
                        f.kind == DATALOADER_STALL for f in prof.session.findings)):
                    end = now
                    break
    out.findings = list(prof.findings)
    return out


def steady_run(logdir: Path, width: int, seconds: float, **options: Any) -> LoopRun:
    """The steady loop (no data problem) for ``seconds``."""
    loader = DataLoader(Samples(width), batch_size=32, shuffle=True, drop_last=True)
    return run_loop(logdir, loader, make_step(width), seconds, **options)


def half_wait_run(logdir: Path, width: int, seconds: float, **options: Any) -> LoopRun:
    """The loop fed by a loader that sleeps as long as a step computes (~50% data wait);
    stops at the first ``dataloader_stall``."""
    step = make_step(width)
    compute_s = median_step_s(step, torch.randn(32, width), 21)
    loader = DataLoader(SleepyBatches(width, compute_s), batch_size=None)
    return run_loop(logdir, loader, step, seconds, stop_at_stall=True, **options)
