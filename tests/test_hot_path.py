"""The hot path on a fake clock: blocks, equivalence with step-by-step processing, bounded memory,
summaries."""

from __future__ import annotations

import json
import random
import sys

import pytest

from profcallbacks import ProfilerConfig, ProfilingSession, Schedule
from profcallbacks.core.ranks import RankInfo
from profcallbacks.core.timing import StepRecord
from profcallbacks.run.blocks import BLOCK_S, BLOCK_STEPS
from profcallbacks.run.defaults import default_detectors
from profcallbacks.testing import FakeClock, StepRecorder


def quiet_config(**options) -> ProfilerConfig:
    return ProfilerConfig(**{"schedule": None, "tensorboard_scalars": False,
                             "watch_capture_file": False, "sync_audit": False,
                             "baseline_capture": False, **options})


def test_detectors_see_steps_once_per_block_and_every_step_in_order(tmp_path):
    clock, recorder = FakeClock(start=1000.0), StepRecorder()
    session = ProfilingSession(quiet_config(), tmp_path, clock=clock, detectors=[recorder])
    session.open()
    clock.now += 0.0001
    session.step_end()  # the first block is one step long: the step rate is not known yet
    assert [r.step for r in recorder.records] == [0]
    recorder.records.clear()
    for i in range(BLOCK_STEPS - 1):
        clock.now += 0.001 * (i + 1)
        session.step_end()
    assert recorder.records == []  # nothing but the buffer until the block ends
    clock.now += 0.5
    session.step_end()
    assert [r.step for r in recorder.records] == list(range(1, BLOCK_STEPS + 1))
    assert [round(r.step_time_s, 9) for r in recorder.records[:3]] == [0.001, 0.002, 0.003]
    assert recorder.records[-1].step_time_s == pytest.approx(0.5)
    took = sum(r.step_time_s for r in recorder.records)
    following = int(BLOCK_S * BLOCK_STEPS / took)  # the next block lasts about BLOCK_S
    assert 1 < following < BLOCK_STEPS
    for _ in range(following):
        assert len(recorder.records) == BLOCK_STEPS
        clock.now += 0.5
        session.step_end()
    assert len(recorder.records) == BLOCK_STEPS + following
    clock.now += 0.5  # 0.5 s steps: blocks of one step
    session.step_end()
    assert len(recorder.records) == BLOCK_STEPS + following + 1
    session.close()


def scenario(seed: int, steps: int) -> list[tuple[float, float]]:
    """(step time, data wait) in seconds: noise, a loader stall episode and a slowdown."""
    rng = random.Random(seed)
    out = []
    for i in range(steps):
        wait = 0.001 + (0.030 if 300 <= i < 420 and i % 3 == 0 else 0.0)
        compute = 0.010 * (1.8 if i >= 700 else 1.0) * rng.uniform(0.95, 1.05)
        out.append((compute + wait, wait))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_detector_results_equal_per_step_processing_on_recorded_sequences(tmp_path, seed):
    steps = scenario(seed, 1000)
    config = quiet_config(capture_on_slowdown=False)
    rank = RankInfo()
    clock = FakeClock(start=1000.0)
    session = ProfilingSession(config, tmp_path, clock=clock, rank=rank,
                               detectors=default_detectors(config, rank))
    session.open()
    for step_time, wait in steps:
        session.data_wait(wait)
        clock.now += step_time
        session.step_end()
    session.close()
    reference = []  # the same records handed to fresh detectors one step at a time
    detectors = default_detectors(config, rank)
    previous = 1000.0
    t = 1000.0
    for i, (step_time, wait) in enumerate(steps):
        t += step_time
        record = StepRecord(i, t - previous, wait, False, i == 0)
        previous = t
        for detector in detectors:
            reference.extend(detector.observe(record))

    def key(findings):
        return [(f.kind, f.step, f.severity, f.message, json.dumps(f.details, sort_keys=True))
                for f in findings]

    assert key(session.findings) == key(reference)
    kinds = {f.kind for f in reference}
    assert {"dataloader_stall", "step_slowdown"} <= kinds  # the scenario finds something


def blocks_now() -> int:
    return sys.getallocatedblocks()


def run_fake_steps(session: ProfilingSession, clock: FakeClock, n: int) -> None:
    step_end = session.step_end
    for i in range(n):
        clock.now += 0.010 + (i % 7) * 1e-4
        step_end()


@pytest.mark.parametrize("log_every", [50, 100_000])  # 100,000: the most allowed
def test_memory_stays_bounded_over_many_steps(tmp_path, log_every):
    """No Python object is retained per step, whatever log_every_n_steps is (issue 17 item 10)."""
    clock = FakeClock(start=1000.0)
    config = quiet_config(log_every_n_steps=log_every)
    session = ProfilingSession(config, tmp_path, clock=clock,
                               detectors=default_detectors(config, RankInfo()))
    session.open()
    run_fake_steps(session, clock, 20_000)  # detectors have filled their windows
    before = blocks_now()
    run_fake_steps(session, clock, 200_000)
    grown = blocks_now() - before
    session.close()
    assert grown < 2_000, f"{grown} blocks retained over 200,000 steps"


@pytest.mark.slow
def test_ten_million_steps_retain_nothing_per_step(tmp_path):
    clock = FakeClock(start=1000.0)
    session = ProfilingSession(quiet_config(stall=None, slowdown=None), tmp_path, clock=clock)
    session.open()
    run_fake_steps(session, clock, 100_000)
    before = blocks_now()
    run_fake_steps(session, clock, 10_000_000)
    grown = blocks_now() - before
    session.close()
    assert grown < 2_000  # bytes per step retained: 0 (a constant, whatever the step count)


def test_run_statistics_leave_captured_steps_out_and_name_the_slowest_step(tmp_path):
    """Issue 12 item 9: exact percentiles over healthy steps; window steps counted apart."""
    from profcallbacks.layout import steps_file
    from profcallbacks.report.analyse.stats import clean_intervals, step_stats

    clock = FakeClock(start=1000.0)
    config = quiet_config(schedule=Schedule(skip_first=100, warmup=1, active=3),
                          log_every_n_steps=40, stall=None, slowdown=None)
    session = ProfilingSession(config, tmp_path, clock=clock)
    session.open()
    for i in range(200):
        if 100 <= i < 104:
            clock.now += 0.500  # the window's steps: slow, and not the job's own
        elif i == 150:
            clock.now += 0.050  # the slowest healthy step
        else:
            clock.now += 0.010 + (i % 10) * 0.001  # 10..19 ms, evenly
        session.step_end()
    session.close()
    rows = [json.loads(line) for line in steps_file(tmp_path, 0).read_text().splitlines()]
    stats = step_stats(clean_intervals(rows))
    # steps 100-103: the window (its export runs in the helper process: later steps count)
    assert stats["steps"] == 200 and stats["steps_excluded"] == 4
    assert stats["max_ms"] == pytest.approx(50.0) and stats["max_step"] == 150
    healthy = sorted([10.0 + i % 10 for i in range(200) if not 100 <= i <= 103 and i != 150]
                     + [50.0])
    assert len(healthy) == 196
    assert stats["median_ms"] == pytest.approx(healthy[97], abs=1e-3)  # nearest rank: 98th
    assert stats["p90_ms"] == pytest.approx(healthy[176], abs=1e-3)  # ceil(176.4) = 177th
    assert stats["p99_ms"] == pytest.approx(healthy[194], abs=1e-3)  # ceil(194.04) = 195th
    assert stats["steps_per_s"] == pytest.approx(196 / sum(healthy) * 1e3, rel=1e-3)
    assert stats["mean_ms"] == pytest.approx(sum(healthy) / 196, rel=1e-3)
    assert "counted_ms" not in stats["intervals"][0]
    # a steps file of 0.2 names the counted steps' fields healthy_*: read alike
    old = [{("healthy" + k[len("counted"):] if k.startswith("counted_") else k): v
            for k, v in row.items()} for row in rows]
    assert "healthy_us" in old[0] and "counted_us" not in old[0]
    old_stats = step_stats(clean_intervals(old))
    assert {k: old_stats[k] for k in ("median_ms", "p99_ms", "max_step", "steps_excluded",
                                      "data_wait_ms")} == {
        k: stats[k] for k in ("median_ms", "p99_ms", "max_step", "steps_excluded", "data_wait_ms")}


@pytest.mark.parametrize(("log_every", "rows"), [(None, [205] * 5), (41, [41] * 25)])
def test_short_steps_are_summarised_every_fifth_of_a_second_unless_told(tmp_path, log_every,
                                                                          rows):
    """~1 ms steps: by default a steps-file row per 0.2 s (205 steps); log_every_n_steps=41
    keeps a row per 41 steps."""
    clock = FakeClock(start=1024.0)
    session = ProfilingSession(quiet_config(log_every_n_steps=log_every, stall=None,
                                            slowdown=None, memory=None), tmp_path, clock=clock)
    session.open()
    for _ in range(1025):
        clock.now += 2.0 ** -10  # 0.98 ms, exact in binary: 204.8 steps per 0.2 s
        session.step_end()
    session.close()
    steps_file = next(tmp_path.rglob("*.steps.jsonl"))
    got = [json.loads(line)["steps"] for line in steps_file.read_text().splitlines()]
    assert got == rows
