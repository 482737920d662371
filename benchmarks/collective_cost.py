"""Cost of profcallbacks' only collectives (gloo, CPU) against a training step.

Run: python -m torch.distributed.run --standalone --nproc_per_node=2 benchmarks/collective_cost.py

Measures, in one run: the trigger agreement (one all_reduce of 2 int64, every log_every_n_steps
steps), an all_gather of 4 floats (the straggler check's size), and a tiny DDP training step.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
from torch import nn


def median_us(fn, repeats: int = 300) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256)

    def train_step() -> None:
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    agree = torch.zeros(2, dtype=torch.int64)
    gathered = [torch.zeros(4) for _ in range(dist.get_world_size())]
    summary = torch.zeros(4)
    results = {
        "DDP training step (tiny MLP)": median_us(train_step),
        "trigger agreement: all_reduce 2 x int64": median_us(
            lambda: dist.all_reduce(agree, op=dist.ReduceOp.MAX)),
        "straggler check: all_gather 4 x float32": median_us(
            lambda: dist.all_gather(gathered, summary)),
    }
    if dist.get_rank() == 0:
        step = results["DDP training step (tiny MLP)"]
        print(f"world size {dist.get_world_size()}, gloo on CPU, medians of 300:")
        for name, us in results.items():
            print(f"  {name:<42} {us:9.1f} us  ({us / step:6.3f} of a step)")
        print("  per step when run every 50 steps: "
              f"{results['trigger agreement: all_reduce 2 x int64'] / 50 / step:.5f} of a step")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
