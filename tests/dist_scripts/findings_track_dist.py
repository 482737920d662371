"""A CPU loop under torchrun (gloo) with a stall and a sync point before one scheduled capture.

Its loader sleeps most of each step from the first on (a stall, still holding when the capture
at steps 14-16 is taken), and its step calls ``.item()`` on a marked line (the sync audit of
steps 2-4 finds it, once per step).
"""

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from profcallbacks import Schedule, StallConfig, StepProfiler, SyncAuditConfig  # noqa: E402
from sync_scenario import scenario_loss  # noqa: E402


class SlowDataset(Dataset):
    def __len__(self) -> int:
        return 1000

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.004)
        return torch.randn(16)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--logdir", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(12):  # 26 tensors: an optimizer stepped tensor by tensor is diagnosed
        layers += [nn.Linear(16, 16), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)  # diagnosed unfused
    loader = DataLoader(SlowDataset(), batch_size=2)
    prof = StepProfiler(args.logdir, schedule=Schedule(skip_first=13, warmup=1, active=3),
                        max_captures=1, tensorboard_scalars=False, slowdown=None,
                        stall=StallConfig(min_duration_s=0.05, min_steps=4, window=4,
                                          block_steps=1),
                        sync_audit=SyncAuditConfig(at_step=2, repeat_at=()), memory=None)
    with prof:
        for step, x in enumerate(prof.wrap(loader)):
            loss, _ = scenario_loss(model, x)
            opt.zero_grad()
            loss.backward()
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            flat = torch.cat([g.flatten() for g in grads])
            dist.all_reduce(flat)  # data parallel by hand, in one bucket
            torch.nn.utils.vector_to_parameters(flat, grads)
            opt.step()
            prof.step()
            if step == 21:
                break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
