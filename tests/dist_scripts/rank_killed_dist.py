"""A CPU loop under torchrun (gloo), one all-reduce per step, a capture window at steps 5-9; one
rank kills itself with SIGKILL in the middle of the window (the others then wait in their
all-reduce until torchrun stops them)."""

import argparse
import os
import signal

import torch
import torch.distributed as dist
from torch import nn

from profcallbacks import Schedule, StepProfiler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--logdir", required=True)
    parser.add_argument("--kill-rank", type=int, default=2)
    parser.add_argument("--kill-step", type=int, default=7)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    prof = StepProfiler(args.logdir, schedule=Schedule(skip_first=5, warmup=0, active=5),
                        max_captures=1, tensorboard_scalars=False, slowdown=None,
                        sync_audit=False, memory=None, log_every_n_steps=1)
    with prof:
        for step in range(30):
            loss = model(torch.randn(8, 16)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            grads = torch.cat([p.grad.flatten() for p in model.parameters()])
            dist.all_reduce(grads)
            opt.step()
            if step == args.kill_step and rank == args.kill_rank:
                os.kill(os.getpid(), signal.SIGKILL)
            prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
