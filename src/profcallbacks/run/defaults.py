"""The detectors every front end runs, built from a ProfilerConfig."""

from __future__ import annotations

from typing import TYPE_CHECKING

from profcallbacks.core.ranks import RankInfo
from profcallbacks.detect.base import Detector, StepAuditor

if TYPE_CHECKING:
    from profcallbacks.options.profiler import ProfilerConfig


def default_detectors(config: ProfilerConfig, rank: RankInfo) -> list[Detector]:
    """The detectors every front end runs, configured from ``config``."""
    from profcallbacks.detect.stall import StallDetector

    detectors: list[Detector] = []
    if config.stall is not None:
        detectors.append(StallDetector(config.stall, rank.rank))
    if config.slowdown is not None:
        from profcallbacks.detect.slowdown import SlowdownDetector

        detectors.append(SlowdownDetector(config.slowdown, rank=rank.rank,
                                          capture=config.capture_on_slowdown))
        if config.slowdown.straggler is not None:
            from profcallbacks.detect.straggler import StragglerDetector

            detectors.append(StragglerDetector(config.slowdown.straggler, rank=rank.rank))
    return detectors


def default_auditor(config: ProfilerConfig, rank: RankInfo) -> StepAuditor | None:
    """The sync audit of ``config.sync_audit`` (``None`` when it is off)."""
    from profcallbacks.detect.sync_audit import SyncAuditor, resolve_sync_audit

    audit = resolve_sync_audit(config.sync_audit)
    return SyncAuditor(audit, rank.rank) if audit is not None else None
