"""One scripted scenario through every front end; each must report the same findings.

The scenario: a loader that sleeps (a stall, or not) and a step with an ``item()`` and a
``nonzero`` on known lines of ``sync_scenario.py``; the runs live in ``front_ends.py``. A second
scenario keeps 1 MB per step on a known line of ``memory_scenario.py``.
"""

from __future__ import annotations

import pytest
import torch

from front_ends import FRONT_ENDS, OPTIONS, STEPS, SleepyDataset
from memory_scenario import keep_location, leaky_step, release
from profcallbacks import MemoryConfig
from sync_scenario import EXPECTED


def summary(findings):
    """What must agree across front ends: stall episodes and the user's own sync sites."""
    return {
        "stall": [f.step < 50 for f in findings if f.kind == "dataloader_stall"],
        "sync": {(f.details["location"], f.details["op"]) for f in findings
                 if f.kind == "sync_point" and not f.details.get("library")},
    }


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_stalled_loader_and_sync_points_give_the_same_findings(tmp_path, front_end):
    findings = FRONT_ENDS[front_end](tmp_path, SleepyDataset(0.008), STEPS, OPTIONS)
    assert summary(findings) == {"stall": [True], "sync": EXPECTED}


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_fast_loader_gives_no_stall(tmp_path, front_end):
    findings = FRONT_ENDS[front_end](tmp_path, SleepyDataset(0.0), STEPS, OPTIONS)
    assert summary(findings) == {"stall": [], "sync": EXPECTED}


class LeakyModel(torch.nn.Module):
    """A step that keeps 1 MB per call (on a known line of ``memory_scenario.py``)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def loss(self, x: torch.Tensor) -> torch.Tensor:
        return leaky_step(self.linear, x, 256 * 1024)


MEMORY_OPTIONS = dict(schedule=None, tensorboard_scalars=False, slowdown=None, stall=None,
                      watch_capture_file=False, sync_audit=False, log_every_n_steps=4,
                      memory=MemoryConfig(sample_every_s=0, warmup_steps=8, window_steps=64,
                                          min_samples=8, min_growth_mb=16))


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_kept_memory_gives_the_same_creep_and_sites(tmp_path, front_end):
    release()
    findings = FRONT_ENDS[front_end](tmp_path, SleepyDataset(0.0), 120, MEMORY_OPTIONS,
                                     model=LeakyModel)
    release()
    creep = [f for f in findings if f.kind == "memory_creep"]
    sites = [f for f in findings if f.kind == "memory_sites"]
    assert len(creep) == 1 and creep[0].details["source"] == "process_rss"
    assert creep[0].details["growth_mb_per_1k_steps"] == pytest.approx(1024, rel=0.3)
    assert len(sites) == 1 and sites[0].details["sites"][0]["location"] == keep_location()
