"""What worker timing and the worker stack sampler cost a DataLoader's throughput.

Three loaders of the same settings (``num_workers=2``, ``persistent_workers=True``, a dataset
whose samples take ``--sample-ms`` of CPU in zlib, as decoding does) are read whole, pass after
pass, the loop doing nothing but fetch (the loader is the bottleneck):

- ``bare A`` and ``bare B``: plain ``iter(loader)``; their ratio is the control and must read 1.00;
- ``timed``: through :class:`~profcallbacks.detect.loader_workers.LoaderWorkers` with timing and
  the stack sampler on (as during a stall), each fetch noted as ``StepProfiler.wrap`` notes it;
- ``hooked off``: the same loader and worker processes with timing and sampler off (as outside a
  stall): the ratio of its passes' CPU to ``timed``'s is free of the difference between two sets
  of worker processes, which the bare-against-bare control shows.

Each round runs one pass of each in a shuffled order (the machine's load drifts: interleaving
spreads it over all three). Two measures, each with its control (bare B against bare A, which
must read 1.00):

- wall: the median over rounds of each round's pass-time ratio (the throughput a loop sees; on
  a shared machine its spread is wide: the quartiles are printed);
- CPU: the workers' CPU seconds (``/proc/PID/stat``) over all passes: what a loader whose
  workers are the bottleneck loses of its throughput, since each batch costs that much more CPU.
  Less sensitive to other processes' load than wall time. Also per round (each pass's own CPU
  seconds, the median of the rounds' ratios, with its quartiles and control): robust to drift.

Cost = timed/bare A - 1.

Usage:
    python benchmarks/loader_cost.py                      # 30 rounds of 60 batches
    python benchmarks/loader_cost.py --rounds 60 --sample-ms 2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
import zlib
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from profcallbacks.detect.loader_workers import LoaderWorkers


class Decode(Dataset[torch.Tensor]):
    """Samples that each compress ``kib`` KiB with zlib."""

    def __init__(self, n: int, kib: int) -> None:
        self.n = n
        self.raw = np.random.default_rng(0).integers(0, 16, kib * 1024, dtype=np.uint8).tobytes()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((64,), float(len(zlib.compress(self.raw, 6)) + i))


def kib_for(ms: float) -> int:
    """KiB that zlib takes about ``ms`` to compress here."""
    raw = np.random.default_rng(0).integers(0, 16, 64 * 1024, dtype=np.uint8).tobytes()
    start = time.perf_counter()
    for _ in range(20):
        zlib.compress(raw, 6)
    per_kib = (time.perf_counter() - start) / 20 / 64 * 1e3
    return max(1, round(ms / per_kib))


def bare_pass(loader: DataLoader[Any]) -> float:
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


def timed_pass(loader: DataLoader[Any], workers: LoaderWorkers) -> float:
    start = time.perf_counter()
    t0 = start
    for _ in workers.iterate(loader):
        t1 = time.perf_counter()
        workers.fetched(t0, t1)
        t0 = time.perf_counter()
    return time.perf_counter() - start


def worker_cpu_s(loader: DataLoader[Any]) -> float:
    """CPU seconds the loader's (persistent) workers have used so far, every thread of them
    (``/proc/PID/task/*/schedstat``: nanoseconds, where ``/proc/PID/stat`` counts 10 ms ticks)."""
    total = 0
    for worker in loader._iterator._workers:  # type: ignore[union-attr]
        for task in os.listdir(f"/proc/{worker.pid}/task"):
            try:
                with open(f"/proc/{worker.pid}/task/{task}/schedstat", encoding="ascii") as f:
                    total += int(f.read().split()[0])
            except OSError:  # a thread that ended meanwhile
                continue
    return total / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--batches", type=int, default=60, help="batches per pass")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--sample-ms", type=float, default=1.0)
    parser.add_argument("--no-sampler", action="store_true", help="worker timing alone")
    args = parser.parse_args()
    torch.set_num_threads(1)
    kib = kib_for(args.sample_ms)
    dataset = Decode(args.batches * args.batch_size, kib)

    def make() -> DataLoader[Any]:
        return DataLoader(dataset, batch_size=args.batch_size, num_workers=2,
                          persistent_workers=True, multiprocessing_context="fork")

    bare_a, bare_b, timed = make(), make(), make()
    workers = LoaderWorkers(lambda: 0, sampler=not args.no_sampler)

    def hooked(on: bool) -> float:
        workers.want("benchmark", on)  # timing and the sampler on (as in a stall), or off
        return timed_pass(timed, workers)

    runs = {"bare A": lambda: bare_pass(bare_a), "bare B": lambda: bare_pass(bare_b),
            "timed": lambda: hooked(True), "hooked off": lambda: hooked(False)}
    for run in runs.values():  # start the workers, warm up
        run()
    loaders = {"bare A": bare_a, "bare B": bare_b, "timed": timed, "hooked off": timed}
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    cpu_pass: dict[str, list[float]] = {name: [] for name in runs}
    rng = random.Random(0)
    for _ in range(args.rounds):
        order = list(runs)
        rng.shuffle(order)
        for name in order:
            before = worker_cpu_s(loaders[name])
            seconds[name].append(runs[name]())
            cpu_pass[name].append(worker_cpu_s(loaders[name]) - before)
    cpu = {name: sum(cpu_pass[name]) for name in runs}
    same = sorted(t / o for o, t in zip(cpu_pass["hooked off"], cpu_pass["timed"], strict=True))
    paired = sorted(t / a for a, t in zip(cpu_pass["bare A"], cpu_pass["timed"], strict=True) if a)
    paired_control = statistics.median(
        b / a for a, b in zip(cpu_pass["bare A"], cpu_pass["bare B"], strict=True) if a)
    control = statistics.median(b / a for a, b in zip(seconds["bare A"], seconds["bare B"],
                                                      strict=True))
    ratio = statistics.median(t / a for a, t in zip(seconds["bare A"], seconds["timed"],
                                                    strict=True))
    ratios = sorted(t / a for a, t in zip(seconds["bare A"], seconds["timed"], strict=True))
    breakdown = workers.breakdown()
    result = {
        "rounds": args.rounds, "batches_per_pass": args.batches, "sample_ms": args.sample_ms,
        "batch_ms_per_worker": round(breakdown.batch_ms, 3) if breakdown else None,
        "bare_batches_per_s": round(args.batches / statistics.median(seconds["bare A"]), 1),
        "control_bare_b_over_bare_a": round(control, 4),
        "timed_time_over_bare": round(ratio, 4),
        "wall_cost": f"{ratio - 1:+.2%}",
        "worker_cpu_s": {name: round(v, 2) for name, v in cpu.items()},
        "cpu_control_bare_b_over_bare_a": round(cpu["bare B"] / cpu["bare A"], 4),
        "cpu_timed_over_bare": round(cpu["timed"] / cpu["bare A"], 4),
        "cpu_cost": f"{cpu['timed'] / cpu['bare A'] - 1:+.2%}",
        "cpu_cost_vs_both_bare": f"{2 * cpu['timed'] / (cpu['bare A'] + cpu['bare B']) - 1:+.2%}",
        "cpu_same_workers_on_over_off": f"{statistics.median(same) - 1:+.2%}",
        "cpu_same_workers_quartiles": [round(same[len(same) // 4], 4),
                                       round(same[3 * len(same) // 4], 4)],
        "cpu_per_round_control": round(paired_control, 4),
        "cpu_per_round_cost": f"{statistics.median(paired) - 1:+.2%}",
        "cpu_per_round_quartiles": [round(paired[len(paired) // 4], 4),
                                    round(paired[3 * len(paired) // 4], 4)],
        "timed_ratio_quartiles": [round(ratios[len(ratios) // 4], 4),
                                  round(ratios[3 * len(ratios) // 4], 4)],
        "sampled_busy": sum(int(h.get("busy") or 0) for h in workers.hot_lines()),
        "timed_batches": len(workers.batches),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
