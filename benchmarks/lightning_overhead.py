"""Per-step cost of profiling a Lightning fit, measured side by side in one process.

Run: python benchmarks/lightning_overhead.py [--steps 300] [--rounds 3]

Configurations, alternated round by round so that machine load hits them alike:
  none         no profiler
  ours         ProfilerCallback (default options; its one capture window is a handful of steps,
               which the median leaves out: this is the cost outside windows)
  lightning    Trainer(profiler=PyTorchProfiler(schedule=...)) with a window of the same size
  simple       Trainer(profiler="simple")
Each round runs every configuration once (in a rotating order) and yields one paired ratio
median_none / median_config (1.0 = no overhead); printed are the median step time (ms) over rounds
and the median of the per-round ratios; "best" is min(none) / min(config) over rounds (load only
ever slows a run down). Last, the core's own cost per step: the session calls the callback makes
each step, timed in a loop. Goal: ours >= 0.99.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.profilers import PyTorchProfiler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from profcallbacks import ProfilerConfig, ProfilingSession, RankInfo, Schedule
from profcallbacks.detect.defaults import default_detectors
from profcallbacks.lightning import ProfilerCallback


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class StepClock(pl.Callback):
    """Wall time between consecutive on_train_batch_end calls (one optimizer step each)."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_train_batch_end(self, *args: Any) -> None:
        self.ends.append(time.perf_counter())

    def step_times_s(self, skip: int) -> list[float]:
        return [b - a for a, b in zip(self.ends[skip:-1], self.ends[skip + 1:], strict=True)]


def configurations(root: Path) -> dict[str, Callable[[], dict[str, Any]]]:
    window = dict(wait=20, warmup=1, active=3)
    return {
        "none": lambda: {},
        "ours": lambda: {"callbacks": [ProfilerCallback(
            root / "ours", schedule=Schedule(skip_first=window["wait"], warmup=1, active=3))]},
        "lightning": lambda: {"profiler": PyTorchProfiler(
            dirpath=root / "lightning", filename="trace",
            schedule=torch.profiler.schedule(**window, repeat=1))},
        "simple": lambda: {"profiler": "simple"},
    }


def run_once(root: Path, steps: int, extra: dict[str, Any]) -> float:
    clock = StepClock()
    callbacks = [*extra.pop("callbacks", []), clock]
    trainer = pl.Trainer(default_root_dir=root, max_steps=steps, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=callbacks, **extra)
    data = TensorDataset(torch.randn(steps * 16, 64))
    trainer.fit(Tiny(), DataLoader(data, batch_size=16))
    return statistics.median(clock.step_times_s(skip=10))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("profcallbacks").setLevel(logging.ERROR)  # findings about this toy loader
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        configs = configurations(Path(tmp))
        names = list(configs)
        medians: dict[str, list[float]] = {name: [] for name in names}
        run_once(Path(tmp) / "warmup", 50, {})  # imports, allocator, thread pools
        for round_ in range(args.rounds):
            order = names[round_ % len(names):] + names[:round_ % len(names)]
            for name in order:
                medians[name].append(run_once(Path(tmp) / name, args.steps, configs[name]()))
    print(f"{'config':<10} {'median step ms':>15} {'speed vs none':>14} {'best':>6}   per-round")
    for name in names:
        ratios = [b / m for b, m in zip(medians["none"], medians[name], strict=True)]
        value = statistics.median(medians[name])
        best = min(medians["none"]) / min(medians[name])
        rounds = " ".join(f"{r:.2f}" for r in ratios)
        print(f"{name:<10} {value * 1e3:>15.3f} {statistics.median(ratios):>14.3f} {best:>6.3f}   "
              f"{rounds}")
    with tempfile.TemporaryDirectory() as tmp:
        print(f"core cost per step outside windows: {core_cost_us(Path(tmp)):.1f} us")


def core_cost_us(logdir: Path, steps: int = 20000) -> float:
    """Microseconds per step of the calls ProfilerCallback makes on the session each step."""
    config = ProfilerConfig(schedule=None, tensorboard_scalars=False)
    rank = RankInfo.detect()
    session = ProfilingSession(config, logdir, rank=rank, detectors=default_detectors(config, rank))
    session.open()
    start = time.perf_counter()
    for _ in range(steps):
        session.resume()
        session.batch_arrived()
        session.step_end()
    elapsed = time.perf_counter() - start
    session.close()
    return elapsed / steps * 1e6

if __name__ == "__main__":
    main()
