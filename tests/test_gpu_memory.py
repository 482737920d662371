"""Memory on CUDA (``pytest -m gpu``): allocator numbers, creep, sites, snapshot, OOM; skipped on CPU."""

from __future__ import annotations

import pickle

import pytest
import torch

from helpers import QUIET
from memory_scenario import keep_location, leaky_step, release
from profcallbacks import MemoryConfig, StepProfiler
from profcallbacks.detect.memory import read_cuda_mb
from profcallbacks.findings import MEMORY_CREEP, MEMORY_SITES, OUT_OF_MEMORY

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


class OnDevice(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.cuda())


def test_reading_cuda_memory_never_syncs():
    torch.ones(1, device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        values = read_cuda_mb()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert set(values) == {"memory_allocated_mb", "memory_reserved_mb", "memory_peak_mb"}


def test_cuda_leak_is_flagged_with_rate_full_step_sites_and_snapshot(tmp_path):
    model = OnDevice().cuda()
    release()
    prof = StepProfiler(tmp_path, memory=MemoryConfig(sample_every_s=0), **QUIET)
    with prof:
        for _ in range(2000):
            leaky_step(model, torch.randn(4, 16), 64 * 1024, device="cuda").backward()
            prof.step()
    release()
    creep = [f for f in prof.findings if f.kind == MEMORY_CREEP]
    sites = [f for f in prof.findings if f.kind == MEMORY_SITES]
    assert len(creep) == 1 and creep[0].details["source"] == "cuda_allocated"
    assert creep[0].details["growth_mb_per_1k_steps"] == pytest.approx(256, rel=0.3)
    assert creep[0].details["full_at_step"] > creep[0].step
    assert sites[0].details["sites"][0]["location"] == keep_location()
    with open(sites[0].details["snapshot"], "rb") as f:
        assert "segments" in pickle.load(f)


def test_cuda_out_of_memory_gives_a_finding_with_allocator_numbers(tmp_path):
    prof = StepProfiler(tmp_path, memory=MemoryConfig(sample_every_s=0), **QUIET)
    with pytest.raises(torch.OutOfMemoryError):
        with prof:
            prof.step()
            torch.empty(2**50, dtype=torch.uint8, device="cuda")
    oom = [f for f in prof.findings if f.kind == OUT_OF_MEMORY]
    assert len(oom) == 1 and "memory_allocated_mb" in oom[0].details["memory"]

