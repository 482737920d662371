"""Every option of the profiler front ends, in one frozen, validated place."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any

from profcallbacks.options.bounds import MAX_CAPTURE_STEPS, SUMMARY_MIN_S
from profcallbacks.options.budget import ByteBudget
from profcallbacks.options.checks import check_bool, check_int, check_number, check_type, fail
from profcallbacks.options.memory import MemoryConfig
from profcallbacks.options.schedule import Schedule
from profcallbacks.options.slowdown import SlowdownConfig
from profcallbacks.options.stall import StallConfig
from profcallbacks.options.sync_audit import SyncAuditConfig
from profcallbacks.options.trace import TraceOptions

MAX_CAPTURES = 10_000
"""Most capture windows one run may take (each is a trace on disk)."""
MAX_LOG_EVERY_N_STEPS = 100_000
"""Most steps per step-time summary: the summary's steps are buffered until then."""
DEFAULT_LOG_EVERY_N_STEPS = 50
"""Steps per summary when ``log_every_n_steps`` is None and steps are not short."""


@dataclass(frozen=True, kw_only=True)
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
            ``None``: 50 steps, or as many as last ``SUMMARY_MIN_S`` = 0.2 s when steps are
            shorter than 4 ms (at most 1,000): fewer rows and TensorBoard points for fast
            loops, whose publishing would otherwise cost ~3 us per 0.25 ms step.
        tensorboard_scalars: Write ``profcallbacks/*`` scalars and findings with a SummaryWriter.
        capture_on_slowdown: A slowdown alert starts a capture of the slow steps.
        ranks: Global ranks that write traces (``None``: all). Every rank still times its steps.
        stall: Dataloader-stall detection (``None``: off).
        slowdown: Step-slowdown alerts (``None``: off).
        sync_audit: Look for host-device sync points in the user's code: a ``SyncAuditConfig``
            (``None``: off; ``True``/``False`` are taken as the defaults/``None``).
        capture_validation: Capture each validation/evaluation run between training steps in a
            window of its own (``stepNNNNNN-validation``; counts towards ``max_captures``).
        memory: Memory numbers at each step summary and ``memory_creep`` alerts (``None``: off).
        baseline_capture: With slowdown captures on, take one capture of ``capture_steps``
            healthy steps (``stepNNNNNN-baseline``) right after the slowdown detector's warm-up
            when no capture was taken yet, so a later slowdown capture gets a
            ``slowdown_diagnosis`` against it. Counts towards ``max_captures``.
        budget: Bytes a capture and the log directory may take on disk, and the merged trace
            of all ranks (``None``: no bound, no merge). See docs/get-started/trace-budgets.md.
        tracker_captures: Log each capture's trace files to the experiment trackers in use (a
            W&B ``profile`` artifact, an MLflow artifact folder): those of HF's ``report_to``,
            Lightning's ``WandbLogger``/``MLFlowLogger`` and a plain loop's ``WandbSink``/
            ``MlflowSink``. ``False`` leaves the files out; the verdict is still logged.

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
    log_every_n_steps: int | None = None
    tensorboard_scalars: bool = True
    capture_on_slowdown: bool = True
    ranks: tuple[int, ...] | None = None
    stall: StallConfig | None = field(default_factory=StallConfig)
    slowdown: SlowdownConfig | None = field(default_factory=SlowdownConfig)
    sync_audit: SyncAuditConfig | None = field(default_factory=SyncAuditConfig)
    capture_validation: bool = False
    memory: MemoryConfig | None = field(default_factory=MemoryConfig)
    baseline_capture: bool = True
    budget: ByteBudget | None = field(default_factory=ByteBudget)
    tracker_captures: bool = True

    @property
    def summary_every(self) -> tuple[int, float]:
        """(steps, least seconds) per step-time summary, from ``log_every_n_steps``."""
        if self.log_every_n_steps is None:
            return DEFAULT_LOG_EVERY_N_STEPS, SUMMARY_MIN_S
        return self.log_every_n_steps, 0.0

    def __post_init__(self) -> None:
        owner = "ProfilerConfig"
        check_type(owner, "schedule", self.schedule, (Schedule, type(None)),
                   "a profcallbacks.Schedule or None (on-demand captures only)", "Schedule(active=3)")
        check_type(owner, "trace", self.trace, TraceOptions, "a profcallbacks.TraceOptions",
                   "TraceOptions(with_stack=True)")
        check_type(owner, "sync_audit", self.sync_audit, (bool, SyncAuditConfig, type(None)),
                   "a profcallbacks.SyncAuditConfig or None (off)", "SyncAuditConfig(at_step=20)")
        if isinstance(self.sync_audit, bool):  # the older spelling of the defaults / off
            object.__setattr__(self, "sync_audit", SyncAuditConfig() if self.sync_audit else None)
        check_type(owner, "stall", self.stall, (StallConfig, type(None)),
                   "a profcallbacks.StallConfig or None (off)", "StallConfig()")
        check_type(owner, "slowdown", self.slowdown, (SlowdownConfig, type(None)),
                   "a profcallbacks.SlowdownConfig or None (off)", "SlowdownConfig()")
        check_type(owner, "memory", self.memory, (MemoryConfig, type(None)),
                   "a profcallbacks.MemoryConfig or None (off)", "MemoryConfig()")
        check_type(owner, "budget", self.budget, (ByteBudget, type(None)),
                   "a profcallbacks.ByteBudget or None (no bound)", "ByteBudget(capture_bytes=50_000_000)")
        check_int(owner, "max_captures", self.max_captures, minimum=1, maximum=MAX_CAPTURES,
                  example=10)
        check_int(owner, "capture_steps", self.capture_steps, minimum=1, maximum=MAX_CAPTURE_STEPS,
                  example=3)
        if self.log_every_n_steps is not None:
            check_int(owner, "log_every_n_steps", self.log_every_n_steps, minimum=1,
                      maximum=MAX_LOG_EVERY_N_STEPS, example=50)
        check_number(owner, "capture_file_poll_s", self.capture_file_poll_s, above=0.0,
                     maximum=3600.0, example=1.0)
        for name in ("watch_capture_file", "tensorboard_scalars", "capture_on_slowdown",
                     "capture_validation", "baseline_capture", "tracker_captures"):
            check_bool(owner, name, getattr(self, name))
        if self.ranks is not None:
            ranks = self.ranks
            if (not isinstance(ranks, (tuple, list)) or not ranks
                    or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in ranks)):
                raise fail(owner, "ranks", ranks, "a non-empty tuple of global ranks (ints >= 0), "
                           "or None for every rank", fix="Use e.g. ranks=(0,).")
            object.__setattr__(self, "ranks", tuple(ranks))

    @classmethod
    def from_arguments(cls, owner: str, options: dict[str, Any], *, logdir: Any = None,
                       on_finding: Any = None, logdir_required: bool = False) -> ProfilerConfig:
        """The config of a front end's ``options`` (its ``**options``), for ``owner`` (its name).

        The hand-over to the one validated config, in one place. The front end's own ``logdir``
        (``None`` allowed unless ``logdir_required``: the callbacks take the framework's
        directory) and ``on_finding`` are checked here too; an option no front end takes (a
        misspelling) is refused, naming it.
        """
        if (logdir is not None or logdir_required) and (not isinstance(logdir, (str, os.PathLike))
                                                        or not str(os.fspath(logdir)).strip()):
            raise fail(owner, "logdir", logdir, "a directory path (it is created if missing)",
                       fix="Use e.g. logdir='runs/exp1'; '.' for the working directory.")
        if on_finding is not None and not callable(on_finding):
            raise fail(owner, "on_finding", on_finding, "a callable taking a Finding, or None",
                       fix="Use e.g. on_finding=print.")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise TypeError(f"{owner}() got an unknown option {unknown[0]!r}; the options are "
                            f"{', '.join(known)} (ProfilerConfig's fields).")
        return cls(**options)

    def options(self) -> dict[str, Any]:
        """Every option by name: the keyword arguments of a front end that has this config."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def traces_rank(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks


DEFAULTS = ProfilerConfig()
"""Every option at its default: the defaults of the front ends' keyword signatures."""
