"""The calibration benchmark's two fastest scenarios run for real (benchmarks/calibration.py; the
table is in docs/explanation/calibration.md):

- removing a per-step .item(), a fix that gains nothing on a CPU (it does not block there): the
  report's prediction is what the test holds, under 5% of the step;
- updating a 4 MB state in place instead of on a copy, a fix that gains about a third of a 0.9 ms
  step: the report names the copy, not the whole step. Whether the prediction meets the
  benchmark's target (30% or 1 ms of the gain measured in the same run) is the benchmark's to
  say (docs/explanation/calibration.md): beside two CPU burners the same scenario's profiled copy
  grew to 0.76-0.78 of the step and the fix measured 0.03-0.73 ms in three runs a minute apart.
  The target's rule itself is held on fixed numbers.

Foreach on a few large parameters, a fix that gains little (0.4-0.7 ms of a 20 ms step), is
predicted at 6-8% of the profiled step (the profiler's cost per operator inflates the loop's
share): the benchmark compares it, this test does not hold it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from calibration import NOTHING_SHARE, Result, run  # noqa: E402
from calibration_scenarios import SCENARIOS  # noqa: E402

FAST = [s for s in SCENARIOS if s.fast and s.kind == "sync_in_step"]
COPY = next(s for s in SCENARIOS if s.kind == "hidden_copies")


@pytest.mark.parametrize("scenario", FAST, ids=[s.name for s in FAST])
def test_a_fix_that_gains_nothing_is_predicted_as_nothing(scenario):
    result = run(scenario, rounds=2, steps=10)
    assert result.traced_share < NOTHING_SHARE, result
    assert result.predicted_ms < NOTHING_SHARE * result.before_ms, result


def test_a_copy_is_named_as_the_copy_not_the_whole_step():
    result = run(COPY, rounds=2, steps=10)
    assert result.kind == "hidden_copies" and "copies' own time" in result.basis, result
    # the copy, not the whole step; named at all, it holds 5% of the step or more. How much
    # more wanders with the neighbours' turns: beside two CPU burners 0.10-0.79 of ten-step
    # captures (a turn elsewhere in the step dilutes it); the share on fixed times is
    # tests/test_diagnoses.py's
    assert result.traced_share < 0.95, result


def result(before_ms: float, share: float, measured_ms: float) -> Result:
    return Result("fixed", "hidden_copies", share * before_ms, share, "", "", before_ms,
                  before_ms - measured_ms, measured_ms)


@pytest.mark.parametrize(("before_ms", "share", "measured_ms", "meets"), [
    (0.9, 0.33, 0.30, True),  # the copy's third of the step, gained
    (10.0, 0.33, 2.6, True),  # predicted 3.3 ms: 0.7 ms off a 2.6 ms gain, within 1 ms
    (10.0, 0.50, 2.0, False),  # predicted 5 ms: 3 ms off, past 30% and 1 ms
    (40.0, 0.30, 10.0, True),  # predicted 12 ms: 2 ms off a 10 ms gain, within 30%
    (40.0, 0.35, 10.0, False),  # predicted 14 ms: 4 ms off, past 30% (3 ms)
    (30.0, 0.04, -5.0, True),  # predicted nothing (under 5%); the fix made the step slower
    (30.0, 0.10, -5.0, False),  # predicted 3 ms where the step got slower: past 1 ms
])
def test_the_benchmarks_target_on_fixed_numbers(before_ms, share, measured_ms, meets):
    fixed = result(before_ms, share, measured_ms)
    assert fixed.predicted_ms == pytest.approx(share * before_ms)
    assert fixed.meets is meets
