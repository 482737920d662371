"""Memory numbers through a ProfilingSession on a fake clock: what reaches the sinks, and when."""

from __future__ import annotations

import json

import pytest

from helpers import QUIET
from profcallbacks import MemoryConfig, ProfilerConfig
from profcallbacks.layout import steps_file


@pytest.mark.parametrize(("sample_every_s", "sampled_at"), [(0.0, [4, 9, 14, 19]), (1.0, [4, 14])])
def test_memory_numbers_reach_the_sinks_at_summaries_at_most_once_per_interval(
        tmp_path, sample_every_s, sampled_at):
    from profcallbacks import ProfilingSession, RankInfo

    seen = []
    now = [0.0]
    config = ProfilerConfig(log_every_n_steps=5, memory=MemoryConfig(sample_every_s=sample_every_s),
                            **QUIET)
    session = ProfilingSession(config, tmp_path, rank=RankInfo(), clock=lambda: now[0],
                               metrics_sinks=[lambda values, step: seen.append((step, values))])
    session.open()
    for step in range(20):
        now[0] = (step + 1) * 0.11  # a summary every 0.55 s (the first step takes time too)
        session.step_end()
    session.close()
    assert [step for step, values in seen if "profcallbacks/process_rss_mb" in values] == sampled_at
    rows = [json.loads(line) for line in steps_file(tmp_path, 0).read_text().splitlines()]
    assert [row["last_step"] for row in rows if "process_rss_mb" in row] == sampled_at
