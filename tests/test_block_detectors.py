"""A detector finds the same whatever the blocks the session cuts the steps into.

Each built-in detector's step logic is written once, in ``observe_block``; ``observe`` is a
block of one step. Each is fed one recorded sequence twice: one step at a time through
``observe``, and in blocks of random length (1-64 steps, as the session cuts them) through
``observe_block``, which takes the block-at-once shortcuts (quiet stretches, CUSUMs run over
segments); the findings (kind, step, message, details) and the state the detectors publish
must be identical. The sequences hold every situation a detector reacts to: warm-up,
captured blocks, steps after a pause, isolated waits, stall episodes (held, or a burst that ends
before the hold) and their end, a stall reported at the run's end, slowdowns, recoveries and
re-baselining, straggler checks.
"""

from __future__ import annotations

import json
import random
from collections import deque

import pytest

from profcallbacks import SlowdownConfig, StallConfig, StragglerConfig
from profcallbacks.core.timing import IntervalSummary, StepRecord, StepTimes, median
from profcallbacks.detect.slowdown import SlowdownDetector
from profcallbacks.detect.stall import StallDetector
from profcallbacks.detect.straggler import StragglerDetector


def sequence(seed: int, steps: int = 3000) -> list[tuple[float, float]]:
    """(step time, data wait) in seconds: noise, stalls, hiccups, a slowdown that recovers,
    one that lasts (re-baselining), short spikes."""
    rng = random.Random(seed)
    out = []
    for i in range(steps):
        wait = 0.0005 * rng.random()
        if 400 <= i < 600 and i % 3 == 0:
            wait += 0.03  # a bursty stall episode
        if 1500 <= i < 1700:
            wait += 0.004  # a mild, steady stall (30% of step time)
        if 2200 <= i < 2240:
            wait += 0.008  # a burst: over the threshold for less than the hold
        if i in (150, 900, 2500):
            wait += 0.4  # isolated hiccups
        if i % 97 == 0:
            wait += rng.uniform(0.045, 0.06)  # waits about as long as the isolated-wait limit
        compute = 0.010 * rng.uniform(0.9, 1.1)
        if 985 <= i < 1000:
            compute *= 1.17  # its lead-in: past the onset reference, mostly under the threshold
        if 1000 <= i < 1250:
            compute *= 2.0  # a slowdown that recovers (before re-baselining at 300 steps)
        if i >= 2000:
            compute *= 1.6  # one that becomes the new normal
        if rng.random() < 0.01:
            compute *= 4  # spikes
        out.append((compute + wait, wait))
    return out


def blocks(seed: int, steps: int, captured_share: float = 0.05) -> list[tuple[int, int, bool, bool]]:
    """(first, end, captured, after_pause) blocks as the session cuts them."""
    rng = random.Random(seed + 100)
    out, first = [], 0
    while first < steps:
        end = min(steps, first + rng.randint(1, 64))
        captured = rng.random() < captured_share
        after_pause = first == 0 or rng.random() < 0.03
        out.append((first, end, captured, after_pause))
        first = end
    return out


def detectors():
    slowdown = SlowdownConfig(warmup_steps=20, baseline_steps=30, baseline_block_s=0.2,
                              min_steps=10, min_duration_s=0.1, rebaseline_after_steps=300,
                              rebaseline_after_s=1.0)
    gathered: list[list[float]] = []

    def gather(mine: list[float]) -> list[list[float]]:
        gathered.append(mine)  # rank 1 is 30% slower than this rank
        return [mine, [mine[0] * 1.3, mine[1], mine[2]]]

    stall = StallDetector(StallConfig(window=20, block_steps=4, min_duration_s=1.5, min_steps=30),
                          rank=0)
    stall.set_loader({"num_workers": 2, "persistent_workers": False, "epoch_ends": True})
    return [stall,  # after a pause, the second step's wait belongs to the start-up (2 workers)
            SlowdownDetector(slowdown, rank=0),
            StragglerDetector(StragglerConfig(every_n_steps=100, consecutive=2, min_steps=10),
                              rank=0, gather=gather)], gathered


def state(detector) -> dict:
    """What a detector carries from one step to the next (its attributes, deques as lists,
    slotted records such as the slowdown CUSUMs as their field values)."""
    return {name: list(value) if isinstance(value, deque)
            else tuple(getattr(value, f) for f in value.__slots__) if hasattr(value, "__slots__")
            else value
            for name, value in vars(detector).items()
            if name not in ("config", "loader", "_gather") and not callable(value)}


def key(findings) -> list[tuple]:
    return [(f.kind, f.step, f.message, json.dumps(f.details, sort_keys=True), f.capture)
            for f in findings]


@pytest.mark.parametrize("seed", range(6))
def test_observe_block_equals_observe_step_by_step(seed):
    steps = sequence(seed)
    cuts = blocks(seed, len(steps))
    by_step, gathered_by_step = detectors()
    by_block, gathered_by_block = detectors()
    kinds, pending, dropped = set(), False, 0
    for (first, end, captured, after_pause) in cuts:
        times = [t for t, _ in steps[first:end]]
        waits = [w for _, w in steps[first:end]]
        for one, block in zip(by_step, by_block, strict=True):
            expected = []
            for k in range(end - first):
                record = StepRecord(first + k, times[k], waits[k], captured,
                                    after_pause and k == 0)
                found = list(one.observe(record))
                expected += found
                if one is by_step[0]:  # a stall episode that ended before it held
                    episode = one._episode
                    dropped += pending and episode is None and not found
                    pending = episode is not None and not episode.alerted
            got = list(block.observe_block(first, times, waits, captured, after_pause))
            assert key(got) == key(expected), (type(one).__name__, first)
            assert state(block) == state(one), (type(one).__name__, first)
            kinds |= {f.kind for f in expected}
    assert dropped >= 1
    assert gathered_by_block == gathered_by_step  # the same numbers met the other ranks
    assert by_block[1].baseline_s == by_step[1].baseline_s
    assert by_block[1].scalars() == by_step[1].scalars()
    assert list(by_block[0]._step_times) == list(by_step[0]._step_times)
    assert {"dataloader_stall", "dataloader_stall_cleared", "dataloader_wait", "step_slowdown",
            "step_speed_recovered", "step_baseline_reset", "straggler"} <= kinds


def reference_summary(records: list[StepRecord]) -> IntervalSummary:
    """The summary of ``records`` as StepTimes made it from one record per step."""
    times = [r.step_time_s for r in records]
    healthy = [r for r in records if not r.excluded]
    slowest = max(healthy or records, key=lambda r: r.step_time_s)
    n = len(records)
    return IntervalSummary(
        records[0].step, records[-1].step, n, sum(times) / n * 1e3, median(times) * 1e3,
        max(times) * 1e3, sum(r.data_wait_s for r in records) / n * 1e3, slowest.step,
        n - len(healthy), tuple(int(r.step_time_s * 1e6 + 0.5) for r in healthy),
        sum(r.data_wait_s for r in healthy) * 1e3)


def test_step_times_summaries_from_blocks_equal_those_of_the_records():
    steps = sequence(7, 530)
    cuts = blocks(7, len(steps), captured_share=0.3)
    times = StepTimes(interval=50)
    records, got = [], []
    for (first, end, captured, _) in cuts:
        records += [StepRecord(k, steps[k][0], steps[k][1], captured) for k in range(first, end)]
        got += times.add_block(first, [t for t, _ in steps[first:end]],
                               [w for _, w in steps[first:end]], captured)
    got.append(times.flush())
    expected = [reference_summary(records[i:i + 50]) for i in range(0, len(records), 50)]
    assert got == expected
    assert any(s.steps_excluded for s in got) and got[-1].steps == 30


@pytest.mark.parametrize("lead", [4, 16])
def test_stall_blocks_taken_at_once_still_see_the_shares_before_them(lead):
    """A stall in the last blocks before a block of quiet steps still counts in the median."""
    times = [0.010] * (lead + 200)
    waits = [0.005] * lead + [0.0] * 200
    config = StallConfig(min_duration_s=0)  # 16 steps: the window alone decides
    one, block = StallDetector(config), StallDetector(config)
    expected = [f for k in range(lead) for f in one.observe(StepRecord(k, times[k], waits[k]))]
    got = list(block.observe_block(0, times[:lead], waits[:lead], False, False))
    expected += [f for k in range(lead, len(times))
                 for f in one.observe(StepRecord(k, times[k], waits[k]))]
    got += block.observe_block(lead, times[lead:], waits[lead:], False, False)
    assert key(got) == key(expected) and state(block) == state(one)
    assert [f.kind for f in got][:1] == ["dataloader_stall"] * (lead == 16)


@pytest.mark.parametrize("seed", range(4))
def test_a_stall_reported_at_the_run_end_is_the_same_block_by_block(seed):
    """A run too short for the hold (1.4-1.8 s of a 29% wait after quiet steps): ``close``
    reports the same episode whichever way the steps came."""
    rng = random.Random(seed)
    steps = [(0.010, 0.0005)] * 40 * seed + [(0.010, 0.004 * rng.uniform(0.9, 1.1))
                                             for _ in range(100 + 10 * seed)]
    by_step, by_block = StallDetector(StallConfig()), StallDetector(StallConfig())
    expected, got = [], []
    for (first, end, captured, after_pause) in blocks(seed, len(steps), captured_share=0.0):
        times, waits = [t for t, _ in steps[first:end]], [w for _, w in steps[first:end]]
        expected += [f for k in range(end - first) for f in by_step.observe(
            StepRecord(first + k, times[k], waits[k], captured, after_pause and k == 0))]
        got += by_block.observe_block(first, times, waits, captured, after_pause)
    for detector, found in ((by_step, expected), (by_block, got)):
        detector.close(failed=False)
        found += detector.take_findings()
    assert key(got) == key(expected) and state(by_block) == state(by_step)
    assert [(f.kind, f.details["run_ended"]) for f in got] == [("dataloader_stall", True)]


@pytest.mark.parametrize("seed", range(3))
def test_start_up_waits_of_each_worker_are_the_same_block_by_block(seed):
    """Passes that start 2 workers again every 50 steps: the first two steps wait for them
    (one start-up note each pass, no isolated wait), whichever way the steps came."""
    rng = random.Random(seed)
    waits = [0.3 if i % 50 == 0 else 0.2 if i % 50 == 1 else 0.0005 for i in range(400)]
    waits[125] = 0.25  # an isolated wait of its own
    times = [0.010 * rng.uniform(0.9, 1.1) + w for w in waits]
    cuts, first = [], 0
    while first < len(times):  # a block begins at each pass, others where they fall
        end = min(first + rng.randint(1, 64), (first // 50 + 1) * 50)
        cuts.append((first, end, first % 50 == 0))
        first = end
    info = {"num_workers": 2, "persistent_workers": False, "epoch_ends": True}
    by_step, by_block = StallDetector(StallConfig()), StallDetector(StallConfig())
    by_step.set_loader(info)
    by_block.set_loader(info)
    expected, got = [], []
    for first, end, after_pause in cuts:
        expected += [f for k in range(first, end) for f in by_step.observe(
            StepRecord(k, times[k], waits[k], False, after_pause and k == first))]
        got += by_block.observe_block(first, times[first:end], waits[first:end], False,
                                      after_pause)
        assert state(by_block) == state(by_step), first
    assert key(got) == key(expected)
    assert [(f.step, f.details["pattern"]) for f in got] == [
        (0, "startup"), (50, "startup"), (100, "startup"), (125, "isolated"), (150, "startup")]


def test_short_steps_are_summarised_in_longer_intervals_that_last_min_s():
    """Steps of 1 ms, interval 50, min_s 0.1: each summary covers 100 steps, at most 1,000."""
    times = StepTimes(interval=50, min_s=0.1)
    got = times.add_block(0, [0.001] * 450, [0.0] * 450, False)
    assert [s.steps for s in got] == [100, 100, 100, 100]  # 50 steps are 50 ms: too short
    assert got[1].first_step == 100 and got[-1].last_step == 399  # 50 steps wait for more
    tiny = StepTimes(interval=50, min_s=0.1)  # 1 us steps: capped at 1,000 per summary
    assert [s.steps for s in tiny.add_block(0, [1e-6] * 2500, [0.0] * 2500, False)] == [1000] * 2
    slow = StepTimes(interval=50, min_s=0.1)  # long steps: every 50 as before
    assert [s.steps for s in slow.add_block(0, [0.01] * 120, [0.0] * 120, False)] == [50, 50]
    assert slow.flush().steps == 20


@pytest.mark.parametrize("change", [1.0, 1.15, 3.0])
@pytest.mark.parametrize("seed", range(3))
def test_observe_block_equals_observe_step_by_step_before_the_first_baseline(seed, change):
    """The early check (a first block of 2 s: 200 steps before a baseline) taken block-at-once:
    steady noise, a mild change and a large one from step 80 (alerted early)."""
    config = SlowdownConfig(warmup_steps=20, baseline_steps=30, baseline_block_s=2.0,
                            min_steps=10, min_duration_s=0.1, early_steps=20)
    rng = random.Random(seed)
    times = [0.010 * rng.uniform(0.85, 1.15) * (change if i >= 80 else 1.0)
             * (4 if rng.random() < 0.02 else 1) for i in range(400)]
    by_step, by_block = SlowdownDetector(config), SlowdownDetector(config)
    expected, got = [], []
    for (first, end, captured, after_pause) in blocks(seed, len(times), captured_share=0.02):
        segment = times[first:end]
        for k, t in enumerate(segment):
            expected += by_step.observe(StepRecord(first + k, t, 0.0, captured,
                                                   after_pause and k == 0))
        got += by_block.observe_block(first, segment, [0.0] * len(segment), captured,
                                      after_pause)
        assert state(by_block) == state(by_step), first
    assert key(got) == key(expected)
    early_alerts = [f for f in expected if f.kind == "step_slowdown" and "before a baseline" in f.message]
    assert bool(early_alerts) == (change == 3.0)
