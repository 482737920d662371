"""Detectors: small online analyses of step timings that produce findings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from profcallbacks.ranks import RankInfo

if TYPE_CHECKING:
    from profcallbacks.config import ProfilerConfig
    from profcallbacks.session import Detector, StepAuditor


def default_detectors(config: ProfilerConfig, rank: RankInfo) -> list[Detector]:
    """The detectors every front end runs, configured from ``config``."""
    from profcallbacks.detectors.stall import StallDetector

    detectors: list[Detector] = []
    if config.stall is not None:
        detectors.append(StallDetector(config.stall, rank.rank))
    if config.slowdown is not None:
        from profcallbacks.detectors.slowdown import SlowdownDetector

        detectors.append(SlowdownDetector(config.slowdown, rank=rank.rank,
                                          capture=config.capture_on_slowdown))
        if config.slowdown.straggler is not None:
            from profcallbacks.detectors.straggler import StragglerDetector

            detectors.append(StragglerDetector(config.slowdown.straggler, rank=rank.rank))
    return detectors


def default_auditor(config: ProfilerConfig, rank: RankInfo) -> StepAuditor | None:
    """The sync audit of ``config.sync_audit`` (``None`` when it is off)."""
    from profcallbacks.syncpoints import SyncAuditor, resolve_sync_audit

    audit = resolve_sync_audit(config.sync_audit)
    return SyncAuditor(audit, rank.rank) if audit is not None else None
