"""Dataloader stall detection from the always-on step timing (issue 5 fleshes this out)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StallConfig:
    """When waiting for data counts as a stall.

    Args:
        share_threshold: Share of step time spent waiting for data above which steps stall.
        window: Steps over which that share is measured.
    """

    share_threshold: float = 0.25
    window: int = 20
