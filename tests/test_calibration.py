"""The calibration benchmark's steady scenario run for real: removing a per-step .item(), a fix that
gains nothing on a CPU (it does not block there). The report's prediction is what this test
holds: under 5% of the step. The measured gain beside it depends on how busy the machine is, so
it is the benchmark's to compare (benchmarks/calibration.py; the table is in
docs/explanation/calibration.md). Foreach on a few large parameters, a fix that gains little
(0.4-0.7 ms of a 20 ms step), is predicted at 6-8% of the profiled step (the profiler's cost per
operator inflates the loop's share): the benchmark compares it, this test does not hold it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from calibration import NOTHING_SHARE, run  # noqa: E402
from calibration_scenarios import SCENARIOS  # noqa: E402

FAST = [s for s in SCENARIOS if s.fast and s.kind == "sync_in_step"]


@pytest.mark.parametrize("scenario", FAST, ids=[s.name for s in FAST])
def test_a_fix_that_gains_nothing_is_predicted_as_nothing(scenario):
    result = run(scenario, rounds=2, steps=10)
    assert result.traced_share < NOTHING_SHARE, result
    assert result.predicted_ms < NOTHING_SHARE * result.before_ms, result
