"""Shared test helpers: the quiet options, a tiny model, a training step, and trace-file readers."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

QUIET: dict[str, Any] = dict(schedule=None, stall=None, slowdown=None, sync_audit=False,
                             tensorboard_scalars=False, watch_capture_file=False)
"""Profiler options that turn off what a test does not look at: scheduled captures, the stall and
slowdown detectors, the sync audit, TensorBoard scalars and the CAPTURE file. A test adds what it
looks at (``StepProfiler(tmp_path, memory=..., **QUIET)``; ``{**QUIET, "memory": None}``)."""


def tiny_model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    x = torch.randn(8, 16)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def load_trace(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def capture_dirs(logdir: Path) -> list[Path]:
    return sorted(p for p in logdir.iterdir() if p.is_dir() and p.name.startswith("step"))


def trace_files(capture_dir: Path) -> list[Path]:
    return sorted(capture_dir.glob("*.pt.trace.json.gz"))


def profiler_steps(trace: dict[str, Any]) -> list[int]:
    """Step numbers of the ``ProfilerStep#N`` ranges in a trace, in order."""
    names = [e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
    return sorted(int(n.split("#")[1]) for n in names)


def captured_steps(logdir: Path) -> dict[str, list[int]]:
    """``{capture directory name: steps}`` read from the trace files."""
    out = {}
    for d in capture_dirs(logdir):
        files = trace_files(d)
        assert len(files) == 1, f"{d} holds {files}"
        out[d.name] = profiler_steps(load_trace(files[0]))
    return out


def torchrun(script: Path, nproc: int, *args: str,
             timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``script`` under torchrun with ``nproc`` ranks on this machine (one thread each), run once
    more when the port torchrun picked was taken before it bound it."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           "--standalone", str(script), *args]
    for _ in range(2):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode == 0 or "address already in use" not in proc.stderr.lower():
            break
    return proc
