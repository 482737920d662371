"""A plain DDP loop under torchrun (gloo, CPU), used by the distributed tests."""

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch import nn

from profcallbacks import Schedule, StepProfiler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--logdir", required=True)
    parser.add_argument("--results", required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--capture-on-rank", type=int, default=-1)
    parser.add_argument("--raise-on-rank", type=int, default=-1)
    parser.add_argument("--no-ddp", action="store_true")
    parser.add_argument("--ranks", default="")
    parser.add_argument("--compile-longer-on-rank", type=int, default=-1,
                        help="torch.compile the model; this rank's inputs grow at step 10")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    if not args.no_ddp:
        model = nn.parallel.DistributedDataParallel(model)
    compiled = args.compile_longer_on_rank >= 0
    if compiled:
        model = torch.compile(model, backend="aot_eager", dynamic=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ranks = tuple(int(r) for r in args.ranks.split(",")) if args.ranks else None
    prof = StepProfiler(args.logdir, schedule=Schedule(skip_first=3, warmup=1, active=2),
                        log_every_n_steps=10, ranks=ranks, tensorboard_scalars=False)
    with prof:
        for step in range(args.steps):
            longer = compiled and step >= 10 and rank == args.compile_longer_on_rank
            x = torch.randn(8, 5 if longer else 4, 16) if compiled else torch.randn(8, 16)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step == 12 and rank == args.capture_on_rank:
                prof.capture(steps=2)
            if step == 15 and rank == args.raise_on_rank:
                raise RuntimeError(f"rank {rank} fails on purpose")
            prof.step()
    out = {"rank": rank, "world_size": dist.get_world_size(), "local_rank": int(os.environ["LOCAL_RANK"]),
           "captures": sorted(p.name for p in prof.captures),
           "findings": [[f.kind, f.step, f.rank, f.details.get("changed")] for f in prof.findings
                        if f.kind in ("recompile", "compile_fallback", "graph_break")]}
    with open(os.path.join(args.results, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
