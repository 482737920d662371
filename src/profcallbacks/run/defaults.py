"""What a session runs between blocks of steps, built from a ProfilerConfig: its own
participants (captures, memory, audit) and the detectors every front end runs."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from profcallbacks.core.ranks import RankInfo
from profcallbacks.detect.base import Detector, Participant, StepAuditor
from profcallbacks.detect.loader_workers import LoaderWorkers
from profcallbacks.detect.stall import StallDetector
from profcallbacks.findings import Finding

if TYPE_CHECKING:
    from profcallbacks.capture.controller import CaptureController
    from profcallbacks.capture.trace_writer import CaptureHook
    from profcallbacks.options.profiler import ProfilerConfig
    from profcallbacks.run.dispatch import Participants


def live_analysis() -> CaptureHook:
    """The analysis the export helper runs on each published capture (``capture_verdict``,
    ``slowdown_diagnosis``), imported when a session starts: a broken install stops it there."""
    try:
        from profcallbacks.report.capture_findings import capture_findings
    except ImportError as exc:
        raise ImportError(f"profcallbacks: the live capture analysis cannot be imported ({exc}); "
                          "reinstall profcallbacks (pip install --force-reinstall profcallbacks)") from exc
    return capture_findings


def own_participants(config: ProfilerConfig, captures: CaptureController, logdir: Path,
                     rank: RankInfo, *, start_step: int,
                     auditor: StepAuditor | None) -> list[Participant]:
    """The session's participants, in the order every hook runs (the detectors follow):

    1. the baseline rule: it asks for its capture before the window opens at a boundary;
    2. the capture windows: they open and close at the boundary (``end_block`` ends a
       window step's span first, before any other bookkeeping);
    3. the memory work: it looks at the window just opened, and its spy enters before the
       audit's (dispatch modes leave in the order they came; ``close`` runs in reverse);
    4. the sync audit (``auditor``, else ``config.sync_audit``'s): it starts only outside
       capture windows, and stops first at the end of its step, before any detector work.
    """
    from profcallbacks.run.memory_monitor import MemoryMonitor
    from profcallbacks.run.participants import BaselineRule, CaptureWindows, MemoryWork, StepAudit

    participants: list[Participant] = []
    slowdown = config.slowdown
    if config.baseline_capture and slowdown is not None and config.capture_on_slowdown:
        participants.append(BaselineRule(captures, start_step + slowdown.warmup_steps + 1))
    participants.append(CaptureWindows(captures))
    if config.memory is not None:
        participants.append(MemoryWork(MemoryMonitor(config.memory, logdir, rank=rank.rank),
                                       captures))
    auditor = auditor if auditor is not None else default_auditor(config, rank)
    if auditor is not None:
        participants.append(StepAudit(auditor, captures))
    return participants


def default_detectors(config: ProfilerConfig, rank: RankInfo) -> list[Detector]:
    """The detectors every front end runs, configured from ``config``."""
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
    from profcallbacks.detect.sync_audit import SyncAuditor
    from profcallbacks.options.sync_audit import resolve_sync_audit

    audit = resolve_sync_audit(config.sync_audit)
    return SyncAuditor(audit, rank.rank) if audit is not None else None


def workers_timing(config: ProfilerConfig, step: Callable[[], int]) -> LoaderWorkers:
    """The loader workers' timing as ``config.stall`` asks for it (not yet wired)."""
    stall = config.stall
    return LoaderWorkers(step, enabled=stall is not None and stall.time_workers,
                         sampler=stall is not None and stall.sample_workers,
                         share_on=stall.share_threshold if stall is not None else 0.2)


def loader_workers(config: ProfilerConfig, step: Callable[[], int], participants: Participants,
                   captures: CaptureController) -> LoaderWorkers:
    """The timing of the loader's workers, wired to the stall detector (it asks for the timing
    while a stall is open) and to the capture windows (each capture gets the workers' tracks)."""
    workers = workers_timing(config, step)
    for member in participants.members:
        if isinstance(member, StallDetector):
            member.workers = workers
    captures.loader_batches = workers.spans
    participants.add(_TimeWorkersInWindows(workers, captures))
    return workers


class _TimeWorkersInWindows(Participant):
    """Asks for worker timing while a capture window records (its trace gets their tracks; the
    stack sampler runs only while a stall is open), and removes the loader hooks at the end."""

    def __init__(self, workers: LoaderWorkers, captures: CaptureController) -> None:
        self._workers = workers
        self._captures = captures

    def begin_block(self, step: int, now: float) -> Iterable[Finding]:
        self._workers.want("capture", self._captures.window_open, sampling=False)
        return ()

    def close(self, *, failed: bool) -> None:
        self._workers.detach()
