"""Every option of the profiler front ends, in one frozen, validated place."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from profcallbacks.capture.options import TraceOptions
from profcallbacks.capture.schedule import Schedule
from profcallbacks.detect.slowdown import SlowdownConfig
from profcallbacks.detect.stall import StallConfig
from profcallbacks.detect.sync_audit import SyncAuditConfig


def _positive(owner: str, name: str, value: float, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{owner}({name}={value!r}): {name} must be a positive number. {fix}")


@dataclass(frozen=True)
class ProfilerConfig:
    """Options shared by ``StepProfiler`` and the Lightning and Hugging Face callbacks.

    Args:
        schedule: Scheduled captures; ``None`` captures only on demand.
        trace: What each capture records (``torch.profiler.profile`` options).
        max_captures: Most capture windows in one run, whatever triggers them.
        capture_steps: Recorded steps in a capture triggered by ``capture()``, the CAPTURE file
            or a slowdown alert (when not given there).
        watch_capture_file: Start a capture when a file named ``CAPTURE`` appears in logdir.
        capture_file_poll_s: Seconds between checks for that file.
        log_every_n_steps: Steps per logged step-time summary (scalars and steps file).
        tensorboard_scalars: Write ``profcallbacks/*`` scalars and findings with a SummaryWriter.
        capture_on_slowdown: A slowdown alert starts a capture of the slow steps.
        ranks: Global ranks that write traces (``None``: all). Every rank still times its steps.
        stall: Dataloader-stall detection (``None``: off).
        slowdown: Step-slowdown alerts (``None``: off).
        sync_audit: Look for host-device sync points in the user's code: ``True`` for the
            defaults, a ``SyncAuditConfig`` to choose the audited steps and an allowlist.
        capture_validation: Capture each validation/evaluation run between training steps in a
            window of its own (``stepNNNNNN-validation``; counts towards ``max_captures``).

    Example:
        >>> ProfilerConfig(schedule=Schedule(skip_first=5, active=2), max_captures=3).max_captures
        3
    """

    schedule: Schedule | None = field(default_factory=Schedule)
    trace: TraceOptions = field(default_factory=TraceOptions)
    max_captures: int = 10
    capture_steps: int = 3
    watch_capture_file: bool = True
    capture_file_poll_s: float = 1.0
    log_every_n_steps: int = 50
    tensorboard_scalars: bool = True
    capture_on_slowdown: bool = True
    ranks: tuple[int, ...] | None = None
    stall: StallConfig | None = field(default_factory=StallConfig)
    slowdown: SlowdownConfig | None = field(default_factory=SlowdownConfig)
    sync_audit: bool | SyncAuditConfig = True
    capture_validation: bool = False

    def __post_init__(self) -> None:
        if self.schedule is not None and not isinstance(self.schedule, Schedule):
            raise TypeError(f"schedule={self.schedule!r}: expected profcallbacks.Schedule(...) "
                            "or None for on-demand captures only.")
        if not isinstance(self.sync_audit, (bool, SyncAuditConfig)):
            raise TypeError(f"sync_audit={self.sync_audit!r}: expected True, False or "
                            "profcallbacks.SyncAuditConfig(...).")
        if not isinstance(self.trace, TraceOptions):
            raise TypeError(f"trace={self.trace!r}: expected profcallbacks.TraceOptions(...).")
        for name, fix in (("max_captures", "Use e.g. max_captures=10."),
                          ("capture_steps", "Use e.g. capture_steps=3."),
                          ("log_every_n_steps", "Use e.g. log_every_n_steps=50.")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int of at least 1, got {value!r}. {fix}")
        _positive("ProfilerConfig", "capture_file_poll_s", self.capture_file_poll_s,
                  "Use e.g. capture_file_poll_s=1.0.")
        if self.ranks is not None:
            ranks = tuple(self.ranks)
            if not ranks or any(isinstance(r, bool) or not isinstance(r, int) or r < 0
                                for r in ranks):
                raise ValueError(f"ranks={self.ranks!r}: expected non-negative global ranks, "
                                 "e.g. ranks=(0,), or None for every rank.")
            object.__setattr__(self, "ranks", ranks)

    @classmethod
    def from_arguments(cls, arguments: dict[str, Any]) -> ProfilerConfig:
        """The config of a front end's keyword arguments (its ``locals()`` in ``__init__``).

        Every front end spells out the same options in its signature (IDEs, LightningCLI and
        ``help()`` see them); this keeps the hand-over to the one validated config in one place.
        """
        return cls(**{f.name: arguments[f.name] for f in fields(cls) if f.name in arguments})

    def traces_rank(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks
