"""The Lightning front end: a ``Callback`` that translates Trainer hooks into session calls."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.loggers import TensorBoardLogger
    from lightning.pytorch.profilers import PassThroughProfiler, PyTorchProfiler
    from typing_extensions import override
except ModuleNotFoundError as exc:  # pragma: no cover - exercised without the extra installed
    raise ModuleNotFoundError(
        f"profcallbacks.lightning needs Lightning ({exc.name} is missing): "
        "pip install 'profcallbacks[lightning]'") from exc

from profcallbacks.core.ranks import RankInfo
from profcallbacks.core.triggers import MANUAL, VALIDATION
from profcallbacks.findings import Finding, FindingHandler
from profcallbacks.integrations.base import RunLog, check_metrics_sink, close_quietly, extra_sinks
from profcallbacks.integrations.lightning_loggers import LoggerFindings
from profcallbacks.lightning_fetch import FetchTimer, FirstPassTiming
from profcallbacks.options.bounds import check_capture_steps
from profcallbacks.options.front_end import ProfilerOptions, Unpack, takes_profiler_options
from profcallbacks.options.profiler import ProfilerConfig
from profcallbacks.run.session import ProfilingSession
from profcallbacks.run.sinks import MetricsSink

log = logging.getLogger(__name__)


class ProfilerCallback(Callback):
    """Profiles ``Trainer.fit``: step timing always, torch.profiler only in capture windows.

    A step is one optimizer step (``accumulate_grad_batches`` micro-batches); its time and its
    ``ProfilerStep#N`` range hold its batch fetches, forwards, backwards and optimizer step.
    Validation, epoch ends and checkpoints belong to no step. Steps are numbered by
    ``trainer.global_step``, also after resuming from a checkpoint.

    Args:
        logdir: Directory for traces, scalars and findings (default: ``trainer.log_dir``).

    The other options are :class:`~profcallbacks.StepProfiler`'s, with two Lightning specifics:
    ``max_captures`` counts the captures of the run before a resume, and ``tensorboard_scalars``
    is turned off on rank 0 when a ``TensorBoardLogger`` already writes to ``logdir`` (the
    scalars go through the Trainer's loggers). Scalars and findings reach every logger of the
    Trainer (:class:`~profcallbacks.integrations.lightning_loggers.LoggerFindings`).

    Example:
        >>> from profcallbacks import Schedule
        >>> callback = ProfilerCallback(schedule=Schedule(skip_first=10, active=5))
        >>> trainer = Trainer(callbacks=[callback])     # doctest: +SKIP
        >>> trainer.fit(model); callback.findings       # doctest: +SKIP
    """

    @takes_profiler_options
    def __init__(self, logdir: str | os.PathLike[str] | None = None, *,
                 on_finding: FindingHandler | None = None, metrics_sink: MetricsSink | None = None,
                 **options: Unpack[ProfilerOptions]) -> None:
        self.config = ProfilerConfig.from_arguments(type(self).__name__, dict(options),
                                                    logdir=logdir, on_finding=on_finding)
        self._metrics_sink = check_metrics_sink(type(self).__name__, metrics_sink)
        self.logdir: Path | None = Path(logdir) if logdir is not None else None
        self.session: ProfilingSession | None = None
        self._on_finding = on_finding
        self._pending_captures: list[tuple[int, str]] = []
        self._earlier_captures: list[Path] = []
        self._captures_started = 0
        self._findings: list[Finding] = []
        self._stepped = False  # on_before_optimizer_step ran in this batch
        self._other_kineto = False
        self._trainer: Any = None
        self._fetch_timer: FetchTimer | None = None
        self._logger_findings: list[LoggerFindings] = []
        self._first_pass: FirstPassTiming | None = None

    @classmethod
    def from_config(cls, config: ProfilerConfig, logdir: str | os.PathLike[str] | None = None, *,
                    on_finding: FindingHandler | None = None,
                    metrics_sink: MetricsSink | None = None) -> ProfilerCallback:
        """A callback with the options of ``config`` (one config shared by several front ends)."""
        return cls(logdir, **config.options(), on_finding=on_finding, metrics_sink=metrics_sink)

    @property
    def findings(self) -> list[Finding]:
        """Findings of the current (or last) fit on this rank."""
        return self.session.findings if self.session is not None else self._findings

    @property
    def captures(self) -> list[Path]:
        """Capture directories written so far, those of runs before a resume included."""
        return self._earlier_captures + (self.session.captures if self.session else [])

    def capture(self, steps: int | None = None) -> None:
        """Capture ``steps`` steps (default ``capture_steps``) starting at the next step."""
        check_capture_steps(steps)
        if self._other_kineto:
            log.warning("profcallbacks: capture() ignored: Trainer(profiler=PyTorchProfiler) "
                        "owns torch.profiler in this fit.")
        elif self.session is not None:
            self.session.request_capture(steps, trigger=MANUAL)
        else:  # delivered when training starts
            self._pending_captures.append((steps or self.config.capture_steps, MANUAL))

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._first_pass = FirstPassTiming(self.config, trainer)  # begun before on_train_start
        self._first_pass.start()
        if self.logdir is None:  # a broadcast: every rank calls it here, together
            self.logdir = Path(trainer.log_dir or trainer.default_root_dir)
        other = getattr(trainer, "profiler", None)  # public, though set outside Trainer's stubs
        self._other_kineto = isinstance(other, PyTorchProfiler)
        if self._other_kineto:
            log.warning("profcallbacks: Trainer(profiler=%s) is set as well as ProfilerCallback. "
                        "Two torch.profilers in one process can crash kineto, so this callback "
                        "takes no captures in this fit (step timing and findings go on). Remove "
                        "Trainer(profiler=...) to get captures.", type(other).__name__)
        elif other is not None and not isinstance(other, PassThroughProfiler):
            log.warning("profcallbacks: Trainer(profiler=%s) is set as well as ProfilerCallback: "
                        "its overhead lasts the whole run and counts in every step time.",
                        type(other).__name__)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._first_pass is not None:  # a fit that never reached on_train_start
            self._first_pass.stop()
            self._first_pass = None

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        assert self.logdir is not None, "setup() resolves logdir before training starts"
        config = self.config
        if trainer.is_global_zero and self._tensorboard_logger_writes_to(trainer, self.logdir):
            config = dataclasses.replace(config, tensorboard_scalars=False)  # no double scalars
        if self._other_kineto:
            config = dataclasses.replace(config, schedule=None, watch_capture_file=False,
                                         capture_on_slowdown=False, capture_validation=False,
                                         baseline_capture=False)
            self._pending_captures.clear()
        rank = RankInfo.detect()  # the process group exists by now
        self.session = ProfilingSession(
            config, self.logdir, rank=rank, on_finding=self._on_finding,
            metrics_sinks=[*(logger.log_metrics for logger in trainer.loggers),
                           *extra_sinks(self._metrics_sink)],
            start_step=trainer.global_step, log_findings=trainer.is_global_zero)
        self._logger_findings = [LoggerFindings(logger, log_captures=self.config.tracker_captures)
                                 for logger in trainer.loggers]
        for sink in self._logger_findings:  # findings where the run's metrics go, too
            self.session.add_finding_handler(sink)
        if isinstance(self._metrics_sink, RunLog):
            self.session.add_finding_handler(self._metrics_sink.finding)
        self.session.restore(captures_started=self._captures_started)
        if self._first_pass is not None:
            self._first_pass.hand_over(self.session)
        for steps, trigger in self._pending_captures:
            self.session.request_capture(steps, trigger)
        self._pending_captures.clear()
        self._stepped = False
        self.session.set_loader(trainer.train_dataloader)
        self.session.loader_workers.attach(trainer.train_dataloader)  # its workers' timing
        self._trainer = trainer  # Any: Trainer sets .profiler outside its type stubs
        self._fetch_timer = FetchTimer(self._trainer.profiler, self.session.data_wait)
        self._trainer.profiler = self._fetch_timer  # public attribute; restored in _close
        self.session.open()
        self.session.pause()  # epoch start hooks belong to no step: the first batch resumes

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.session is not None:  # a further pass over the loader: stall advice counts them
            self.session.set_loader(trainer.train_dataloader)
            self.session.loader_workers.attach(trainer.train_dataloader)  # reloaded: a new one

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self.session is not None:
            self.session.resume()  # no-op unless an epoch end or a checkpoint paused it
            if self.session.auditing:
                self.session.mark_batch(batch)

    @override
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: Any) -> None:
        self._stepped = True  # every precision plugin calls it before each optimizer step

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._stepped and self.session is not None:  # the optimizer stepped in this batch
            self._stepped = False  # (a flag: reading trainer.global_step costs ~3 us a batch)
            self.session.step_end()

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.session is not None:
            self.session.pause(VALIDATION)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.session is not None:
            self.session.resume()

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.session is not None:
            self.session.pause()

    @override
    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        if self.session is not None:  # saving runs after every hook: the next batch resumes
            self.session.pause()

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close(failed=False)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        if self.session is not None:
            self.session.on_exception(exception)  # an out_of_memory finding, before it propagates
        self._close(failed=True)

    @override
    def state_dict(self) -> dict[str, Any]:
        """Captures taken so far: ``max_captures`` and ``captures`` span a resumed run."""
        started = self.session.captures_started if self.session else self._captures_started
        return {"captures_started": started, "captures": [str(p) for p in self.captures]}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._captures_started = int(state_dict.get("captures_started", 0))
        self._earlier_captures = [Path(p) for p in state_dict.get("captures", [])]

    def _close(self, *, failed: bool) -> None:
        session, self.session = self.session, None
        if self._first_pass is not None:
            self._first_pass.stop()
            self._first_pass = None
        if session is None:
            return
        if self._trainer is not None and self._trainer.profiler is self._fetch_timer:
            self._trainer.profiler = self._fetch_timer.inner  # nothing of ours stays installed
        self._trainer = None
        session.close(failed=failed)
        for sink in self._logger_findings:
            close_quietly(sink)
        if isinstance(self._metrics_sink, RunLog):
            close_quietly(self._metrics_sink)
        self._logger_findings = []
        self._captures_started = session.captures_started
        self._earlier_captures += session.captures
        self._findings = session.findings

    @staticmethod
    def _tensorboard_logger_writes_to(trainer: pl.Trainer, logdir: Path) -> bool:
        return any(isinstance(logger, TensorBoardLogger)
                   and Path(logger.log_dir).resolve() == logdir.resolve()
                   for logger in trainer.loggers)
