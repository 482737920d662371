"""Step-slowdown alerts (issue 6 fleshes this out)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SlowdownConfig:
    """When slower steps raise an alert.

    Args:
        threshold: Ratio of observed to baseline step time that counts as slow (1.25 = 25% slower).
        warmup_steps: Steps after start that never enter the baseline.
    """

    threshold: float = 1.25
    warmup_steps: int = 20
