"""A 2-rank DDP run over gloo on CPU, profiled with plain torch.profiler (no profcallbacks).

An embedding table with dense gradients: each step looks up a few rows (little compute) and
all-reduces the whole table's gradient (~16 MB), so the collectives dominate the step.

Usage: python gloo_ddp_plain.py OUT_DIR [--rows N]
"""

import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler


def worker(rank: int, world: int, init: str, out: str, rows: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Embedding(rows, 512))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randint(0, rows, (8,))
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3),
                 on_trace_ready=tensorboard_trace_handler(out, worker_name=f"rank{rank}",
                                                          use_gzip=True)) as prof:
        for _ in range(5):
            model(batch).square().mean().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--rows", type=int, default=8192)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "rendezvous")
        mp.start_processes(worker, args=(2, init, args.out, args.rows), nprocs=2, join=True,
                           start_method="fork")  # forked: torch is imported once


if __name__ == "__main__":
    sys.exit(main())
