"""The calibration benchmark's two fast, steady scenarios, run for real: the report's predicted
gain against the gain measured with the fix applied (benchmarks/calibration.py; the full table is
in docs/explanation/calibration.md). Both are fixes that gain nothing on a CPU: foreach on a few
large parameters (the report gave the optimizer's whole time, ~37 ms, as its gain before the gains
became what-ifs) and removing a per-step .item() (it does not block on a CPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from calibration import run  # noqa: E402
from calibration_scenarios import SCENARIOS  # noqa: E402

FAST = [s for s in SCENARIOS if s.fast][:2]


@pytest.mark.parametrize("scenario", FAST, ids=[s.name for s in FAST])
def test_predicted_gain_meets_the_measured_one(scenario):
    result = run(scenario, rounds=5, steps=10)
    assert result.meets, result
