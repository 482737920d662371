"""What one capture window costs training: ours against torch's synchronous on_trace_ready.

Run: python benchmarks/window_cost.py [--repeats 3] [--models nanogpt,many_modules]

Per model (a nanoGPT-style transformer and a network of many small modules, both sized to a
~25 ms step on one CPU thread), in one process, in a shuffled order each repeat:
  ours       StepProfiler(schedule=Schedule(skip_first=W, warmup=1, active=5)), default
             TraceOptions (record_shapes and with_modules on) and the default ByteBudget: the
             run's first window, which saves its first step on its own to measure it
  no-budget  the same with budget=None
  torch      torch.profiler.profile(schedule=schedule(skip_first=W, warmup=1, active=5,
             repeat=1), on_trace_ready=tensorboard_trace_handler(dir)) with the same options:
             its export runs synchronously inside prof.step()
The cost of a window is the excess step time over the window and the 25 steps after it: the sum
of (step time - median step time of the W steps before the window). Goal: ours <= 1.05x torch.
"""

from __future__ import annotations

import argparse
import gc
import logging
import random
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from profcallbacks import Schedule, StepProfiler

BEFORE = 30  # steps before the window: warm-up and the baseline
WINDOW = 6  # one warm-up step and five recorded ones
AFTER = 25


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class NanoGPT(nn.Module):
    def __init__(self, vocab: int = 512, dim: int = 128, layers: int = 4, ctx: int = 64) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
        self.blocks = nn.Sequential(*(Block(dim, 4) for _ in range(layers)))
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        return self.head(self.blocks(x))


def nanogpt_step() -> Callable[[], None]:
    model = NanoGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, 512, (4, 64))

    def step() -> None:
        logits = model(idx)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), idx.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def many_modules_step() -> Callable[[], None]:
    layers: list[nn.Module] = []
    for _ in range(150):
        layers += [nn.Linear(32, 32), nn.LayerNorm(32), nn.ReLU()]
    model = nn.Sequential(*layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(16, 32)

    def step() -> None:
        loss = model(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def excess_s(times: list[float]) -> float:
    base = statistics.median(times[BEFORE - 20:BEFORE])
    return sum(t - base for t in times[BEFORE:BEFORE + WINDOW + AFTER])


def timed_steps(step: Callable[[], None], prof: Any) -> list[float]:
    """Wall time of each step of the run, ``prof.step()`` included, inside ``with prof``."""
    times = []
    with prof:
        last = time.perf_counter()
        for _ in range(BEFORE + WINDOW + AFTER):
            step()
            prof.step()
            now = time.perf_counter()
            times.append(now - last)
            last = now
    return times


def run_ours(step: Callable[[], None], **options: Any) -> list[float]:
    with tempfile.TemporaryDirectory() as logdir:
        prof = StepProfiler(logdir, schedule=Schedule(skip_first=BEFORE, warmup=1, active=5),
                            tensorboard_scalars=False, watch_capture_file=False,
                            capture_on_slowdown=False, sync_audit=False, **options)
        times = timed_steps(step, prof)
        assert len(prof.captures) == 1, prof.captures
    return times


def run_no_budget(step: Callable[[], None]) -> list[float]:
    return run_ours(step, budget=None)


def run_torch(step: Callable[[], None]) -> list[float]:
    with tempfile.TemporaryDirectory() as logdir:
        prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
            with_modules=True, on_trace_ready=torch.profiler.tensorboard_trace_handler(logdir),
            schedule=torch.profiler.schedule(skip_first=BEFORE, wait=0, warmup=1, active=5,
                                             repeat=1))
        return timed_steps(step, prof)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="nanogpt,many_modules")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    makers = {"nanogpt": nanogpt_step, "many_modules": many_modules_step}
    runs: dict[str, Callable[[Callable[[], None]], list[float]]] = {
        "ours": run_ours, "no-budget": run_no_budget, "torch": run_torch}
    shuffle = random.Random(0)
    for name in args.models.split(","):
        step = makers[name]()
        for _ in range(10):
            step()
        excess: dict[str, list[float]] = {label: [] for label in runs}
        base = []
        for _ in range(args.repeats):
            for label in shuffle.sample(list(runs), len(runs)):
                times = runs[label](step)
                gc.collect()  # each run frees its own garbage, not the next run (torch's
                # profiler sits in a reference cycle with its recorded events until collected)
                excess[label].append(excess_s(times))
                base.append(statistics.median(times[:BEFORE]))
        print(f"\n{name}: step {statistics.median(base) * 1e3:.1f} ms; extra training time per "
              f"5-step window (window + {AFTER} steps after), {args.repeats} repeats")
        median = {label: statistics.median(values) for label, values in excess.items()}
        for label, values in excess.items():
            print(f"  {label:9} {' '.join(f'{s * 1e3:7.0f}' for s in values)} ms   median "
                  f"{median[label] * 1e3:.0f} ms")
        print(f"  ours / torch: {median['ours'] / median['torch']:.2f}   no-budget / torch: "
              f"{median['no-budget'] / median['torch']:.2f}   ours / no-budget: "
              f"{median['ours'] / median['no-budget']:.2f}")


if __name__ == "__main__":
    main()
