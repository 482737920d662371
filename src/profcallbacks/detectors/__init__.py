"""Detectors: small online analyses of step timings that produce findings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from profcallbacks.ranks import RankInfo

if TYPE_CHECKING:
    from profcallbacks.config import ProfilerConfig
    from profcallbacks.session import Detector


def default_detectors(config: ProfilerConfig, rank: RankInfo) -> list[Detector]:
    """The detectors every front end runs, configured from ``config``."""
    return []
