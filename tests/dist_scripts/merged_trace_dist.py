"""A tiny CPU loop under torchrun (gloo): explicit all-reduces each step, one scheduled capture."""

import argparse

import torch
import torch.distributed as dist
from torch import nn

from profcallbacks import ByteBudget, Schedule, StepProfiler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--logdir", required=True)
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--capture-bytes", type=int, default=0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    budget = ByteBudget(capture_bytes=args.capture_bytes or None)
    prof = StepProfiler(args.logdir, schedule=Schedule(skip_first=3, warmup=1, active=3),
                        max_captures=1, tensorboard_scalars=False, slowdown=None, stall=None,
                        sync_audit=False, memory=None, budget=budget)
    with prof:
        for _ in range(args.steps):
            loss = model(torch.randn(8, 16)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():  # data parallel by hand: one all-reduce per tensor
                dist.all_reduce(p.grad)
            opt.step()
            prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
