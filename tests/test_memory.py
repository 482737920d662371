"""Memory, unit level: the memory_creep rule on scripted series, the site spy, the options."""

from __future__ import annotations

import random

import pytest
import torch

from profcallbacks import MemoryConfig, ProfilerConfig
from profcallbacks.core.triggers import MEMORY, CaptureRequest
from profcallbacks.detect.memory import MemoryCreepDetector
from profcallbacks.detect.memory_sites import MemorySiteSpy
from profcallbacks.findings import MEMORY_CREEP


def run_detector(series, *, steps: int, every: int = 50, config: MemoryConfig | None = None):
    """Feed ``series(step)`` MB to a detector at every ``every``-th step, with 2 MB of noise."""
    noise = random.Random(0)
    detector = MemoryCreepDetector(config or MemoryConfig(), rank=0)
    return [f for step in range(every - 1, steps, every)
            for f in detector.observe(step, series(step) + noise.uniform(-2, 2))]


def test_growth_of_256_kb_per_step_is_flagged_with_its_rate():
    findings = run_detector(lambda step: 500 + 0.25 * step, steps=2000)
    assert [f.kind for f in findings] == [MEMORY_CREEP]
    assert findings[0].step < 2000
    assert findings[0].details["growth_mb_per_1k_steps"] == pytest.approx(250, rel=0.3)
    assert findings[0].details["source"] == "process_rss"
    assert findings[0].capture == CaptureRequest(MEMORY, profile_memory=True)


@pytest.mark.parametrize("warmup_steps", [200, 0])
def test_warm_up_growth_then_flat_raises_nothing(warmup_steps):
    findings = run_detector(lambda step: 300 + 2 * min(step, 100), steps=5000, every=10,
                            config=MemoryConfig(warmup_steps=warmup_steps))
    assert findings == []


@pytest.mark.parametrize("jump_at", [300, 700, 1200, 2500])
def test_one_jump_then_flat_raises_nothing(jump_at):
    findings = run_detector(lambda step: 400 + (300 if step >= jump_at else 0), steps=5000)
    assert findings == []


def test_cache_growing_in_two_steps_raises_nothing():
    findings = run_detector(lambda step: 400 + 128 * (step >= 900) + 128 * (step >= 1400),
                            steps=5000)
    assert findings == []


def test_one_finding_per_episode_and_again_after_a_flat_spell():
    def series(step):
        return 500 + 0.25 * min(step, 3000) + 0.25 * max(step - 6000, 0)

    findings = run_detector(series, steps=9000)
    assert len(findings) == 2
    assert findings[0].step < 2000 and 6000 < findings[1].step < 8000


def test_cuda_total_gives_the_step_the_device_is_full():
    detector = MemoryCreepDetector(MemoryConfig(warmup_steps=0, window_steps=100), rank=0,
                                   source="cuda_allocated", total_mb=1100.0)
    findings = [f for s in range(0, 100, 10) for f in detector.observe(s, 100.0 + s)]
    assert findings[0].details["full_at_step"] == 70 + 930
    assert "device is full at step 1,000" in findings[0].message


def test_spy_names_the_user_line_of_kept_memory_also_through_libraries():
    linear = torch.nn.Linear(256, 1024)
    kept = []
    with MemorySiteSpy() as spy:
        for _ in range(3):
            scratch = torch.randn(64, 256)
            kept.append(linear(scratch))  # KEPT-HERE
    del scratch
    line = next(i for i, text in enumerate(open(__file__), 1) if text.rstrip().endswith("KEPT-HERE"))
    sites = spy.alive_sites()
    assert sites[0]["location"].endswith(f"test_memory.py:{line}")
    assert sites[0]["count"] == 3 and sites[0]["bytes"] == 3 * 64 * 1024 * 4


def test_bad_memory_options_are_rejected():
    with pytest.raises(ValueError, match="window_steps=0"):
        MemoryConfig(window_steps=0)
    with pytest.raises(ValueError, match="sample_every_s=-1"):
        MemoryConfig(sample_every_s=-1)
    with pytest.raises(ValueError, match="memory='on'"):
        ProfilerConfig(memory="on")
