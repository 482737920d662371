"""A real training loop with a tiny model, synthetic data and a deliberately slow dataloader.

Run:  python examples/plain_loop.py --logdir runs/demo
Then: tensorboard --logdir runs/demo      and      profcallbacks report runs/demo
"""

from __future__ import annotations

import argparse
import logging
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from profcallbacks import Schedule, StepProfiler


class SlowSyntheticDataset(Dataset):
    """Random regression samples; each takes ``delay_s`` to "load", like a slow decoder."""

    def __init__(self, size: int, features: int, delay_s: float) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, features, generator=generator)
        self.y = self.x.sum(dim=1, keepdim=True)
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.delay_s)
        return self.x[index], self.y[index]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--logdir", default="runs/demo")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--delay-ms", type=float, default=0.3, help="per-sample loading delay")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    dataset = SlowSyntheticDataset(args.steps * 16, 32, args.delay_ms / 1e3)
    loader = DataLoader(dataset, batch_size=16, shuffle=True)

    prof = StepProfiler(args.logdir, schedule=Schedule(skip_first=10, warmup=1, active=5, repeat=2,
                                                       wait=20), log_every_n_steps=10)
    total_loss = 0.0
    with prof:
        for step, (x, y) in enumerate(prof.wrap(loader)):
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total_loss += loss.item()  # a deliberate sync point: the audit reports this line
            prof.step()
            if step == 80:
                prof.capture(steps=3)  # an on-demand capture
            if step + 1 >= args.steps:
                break
    print(f"mean loss {total_loss / args.steps:.4f}")
    print(f"{len(prof.captures)} captures in {args.logdir}: "
          + ", ".join(p.name for p in prof.captures))
    # in step order: a capture's verdict comes from the export helper after later findings
    for finding in sorted(prof.findings, key=lambda f: f.step):
        print(f"finding: {finding.kind} at step {finding.step}: {finding.message}")


if __name__ == "__main__":
    main()
