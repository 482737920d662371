"""A real training process for the watch and gate tests: a tiny model through StepProfiler.

    python tests/watch_train.py LOGDIR --steps 150 --sleep-ms 2 --delay-ms 0
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

from profcallbacks import Schedule, StepProfiler

sys.path.insert(0, str(Path(__file__).parent))  # run as a script: the tests' helpers
from report_runs import SlowDataset as Samples  # noqa: E402  (a slow decoder: a stall)


def train(logdir: Path, *, steps: int, sleep_s: float, delay_s: float, log_every: int) -> None:
    """``steps`` steps; each sleeps ``sleep_s`` in the step (extra work) after loading 8 samples
    that take ``delay_s`` each. Captures at steps 41-43, 81-83 and 121-123."""
    torch.manual_seed(0)
    torch.set_num_threads(1)  # a tiny model: more threads only spin against the other processes here
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Samples(steps * 8, delay_s), batch_size=8)
    prof = StepProfiler(logdir, schedule=Schedule(skip_first=4, warmup=1, active=3, wait=36, repeat=3),
                        log_every_n_steps=log_every, tensorboard_scalars=False, sync_audit=False,
                        watch_capture_file=False)
    with prof:
        for step, x in enumerate(prof.wrap(loader)):
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if sleep_s:
                time.sleep(sleep_s)
            prof.step()
            if step + 1 >= steps:
                break


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("logdir", type=Path)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--sleep-ms", type=float, default=0.0)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args()
    train(args.logdir, steps=args.steps, sleep_s=args.sleep_ms / 1e3, delay_s=args.delay_ms / 1e3,
          log_every=args.log_every)
