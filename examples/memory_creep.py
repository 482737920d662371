"""A loop that keeps 256 KB per step (a list of tensors): profcallbacks says how fast memory grows
and which line keeps it. Run: python examples/memory_creep.py runs/leak; profcallbacks report runs/leak
"""

from __future__ import annotations

import logging
import sys

import torch

from profcallbacks import MemoryConfig, StepProfiler

logging.basicConfig(level=logging.WARNING, format="%(message)s")
model = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
history = []
# sample_every_s=0: a memory sample at every step summary even when 50 steps take under a second
prof = StepProfiler(sys.argv[1] if len(sys.argv) > 1 else "runs/leak", schedule=None, slowdown=None,
                    memory=MemoryConfig(sample_every_s=0))
with prof:
    for _ in range(2000):
        loss = model(torch.randn(4, 16)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(torch.zeros(64 * 1024))  # 256 KB kept per step
        prof.step()
