"""One scripted scenario through every front end; each must report the same findings.

The scenario: a loader that sleeps (a stall, or not) and a step with an ``item()`` and a
``nonzero`` on known lines of ``sync_scenario.py``; the runs live in ``front_ends.py``.
"""

from __future__ import annotations

import pytest

from front_ends import FRONT_ENDS, OPTIONS, STEPS, SleepyDataset
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
