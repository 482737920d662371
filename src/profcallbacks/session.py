"""The framework-free core: step timing, detectors, capture windows and export, driven by plain calls."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from profcallbacks.agreement import TriggerAgreement
from profcallbacks.capture import TraceCapture, wall_ns
from profcallbacks.config import ProfilerConfig
from profcallbacks.detectors import default_auditor
from profcallbacks.export import TraceExporter
from profcallbacks.findings import Finding, FindingHandler, FindingRouter, FindingsFile, log_finding
from profcallbacks.loaders import describe_loader
from profcallbacks.planner import CapturePlanner, CaptureRequest
from profcallbacks.postprocess import CaptureInfo
from profcallbacks.ranks import RankInfo
from profcallbacks.schedule import Phase
from profcallbacks.sinks import MetricsSink, StepsFile, TensorBoardWriter, metric_names
from profcallbacks.timing import IntervalSummary, StepRecord, StepTimes
from profcallbacks.triggers import CaptureFileTrigger

log = logging.getLogger(__name__)

Clock = Callable[[], float]
META_DIR = "profcallbacks"


class Detector(Protocol):
    """Looks at each finished step and returns what it concludes (usually nothing)."""

    def observe(self, record: StepRecord) -> Iterable[Finding]: ...


class StepAuditor(Protocol):
    """Watches a few whole steps (e.g. the sync audit); costs nothing on the other steps."""

    next_step: int | None  # audit this step (or the first one after it outside a capture)

    def begin_step(self, step: int) -> None: ...

    def end_step(self, step: int) -> Iterable[Finding]: ...

    def cancel(self) -> None: ...


class ProfilingSession:
    """Turns step boundaries into timings, findings and capture windows.

    Front ends call, in order: ``open()``; per step any number of ``data_wait(seconds)``, then
    ``step_end()``; ``pause()``/``resume()`` around work between steps (validation,
    checkpointing) that must count as no step; ``close()``. A step begins at the previous
    ``step_end()`` (or ``open()``/``resume()``), so its time and its ``ProfilerStep#N`` range
    include fetching its batches.

    Example:
        >>> session = ProfilingSession(ProfilerConfig(), Path("runs/exp1"))  # doctest: +SKIP
        >>> session.open(); session.data_wait(0.002); session.step_end(); session.close()
    """

    def __init__(self, config: ProfilerConfig, logdir: Path, *, rank: RankInfo | None = None,
                 clock: Clock = time.perf_counter, on_finding: FindingHandler | None = None,
                 detectors: Iterable[Detector] = (), metrics_sinks: Iterable[MetricsSink] = (),
                 start_step: int = 0, auditor: StepAuditor | None = None,
                 log_findings: bool = True) -> None:
        self.config = config
        self.logdir = Path(logdir)
        self.rank = rank or RankInfo.detect()
        self._clock = clock
        self._detectors = list(detectors)
        self._auditor = auditor if auditor is not None else default_auditor(config, self.rank)
        self._auditing = False
        self._metrics_sinks = list(metrics_sinks)
        # log_findings=False: findings still reach files, TensorBoard and on_finding, not logging
        # (front ends pass it on ranks other than the world's first, so only one process prints)
        self._router = FindingRouter(([log_finding] if log_findings else [])
                                     + ([on_finding] if on_finding else []))
        self._planner = CapturePlanner(config.schedule, max_captures=config.max_captures)
        self._times = StepTimes(interval=config.log_every_n_steps)
        self._tensorboard: TensorBoardWriter | None = None
        self._steps_file: StepsFile | None = None
        self._file_trigger: CaptureFileTrigger | None = None
        self._exporter: TraceExporter | None = None
        self._capture: TraceCapture | None = None
        self._tid = 0
        self.step = start_step
        self._step_start = 0.0
        self._step_start_ns = 0
        self._data_wait = 0.0
        self._wait_from = 0.0
        self._after_pause = True
        self._paused = False
        self._opened = False
        self._agreement: TriggerAgreement | None = None

    @property
    def findings(self) -> list[Finding]:
        return self._router.findings

    @property
    def captures(self) -> list[Path]:
        """Capture directories exported so far."""
        return list(self._exporter.exported) if self._exporter else []

    @property
    def captures_started(self) -> int:
        """Capture windows opened so far (they count towards ``max_captures``)."""
        return self._planner.captures_started

    def restore(self, *, captures_started: int) -> None:
        """Continue a resumed run: windows opened before the restart count towards ``max_captures``."""
        self._planner.captures_started = captures_started

    def set_loader(self, loader: object) -> None:
        """Tell the detectors which loader feeds the steps (its settings shape their advice)."""
        try:
            info = describe_loader(loader)
        except Exception as exc:
            log.warning("profcallbacks: cannot read the loader's settings (%s).", exc)
            return
        for detector in self._detectors:
            receive = getattr(detector, "set_loader", None)
            if receive is not None:
                receive(info)

    def add_finding_handler(self, handler: FindingHandler) -> None:
        self._router.add_handler(handler)

    def emit(self, finding: Finding) -> None:
        """Deliver ``finding`` to every sink (detectors outside the step loop use this too)."""
        self._router.emit(finding)

    def open(self) -> None:
        """Create the log directory and start timing step ``start_step``."""
        meta = _prepare_logdir(self.logdir)
        self._router.add_handler(FindingsFile(meta / f"rank{self.rank.rank}.findings.jsonl"))
        self._steps_file = StepsFile(meta / f"rank{self.rank.rank}.steps.jsonl")
        if self.config.tensorboard_scalars:
            self._tensorboard = TensorBoardWriter(self.logdir)
            self._tensorboard.start()  # import and create now, not inside a timed step
            self._router.add_handler(self._tensorboard.finding)
        if self.config.watch_capture_file and self.rank.rank == 0:
            self._file_trigger = CaptureFileTrigger(self.logdir,
                                                    poll_s=self.config.capture_file_poll_s)
        tracing = len(self.config.ranks) if self.config.ranks else self.rank.world_size
        self._exporter = TraceExporter(self.logdir, tracing_ranks=min(tracing,
                                                                      self.rank.world_size))
        self._agreement = _agreement_for(self.rank, self.config.log_every_n_steps)
        self._tid = threading.get_native_id()
        self._opened = True
        self._begin_step()
        self._after_pause = True

    def request_capture(self, steps: int | None = None, trigger: str = "manual") -> None:
        """Capture ``steps`` steps (default ``config.capture_steps``) from the next step on."""
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)
                                  or steps < 1):
            raise ValueError(f"capture(steps={steps!r}): steps must be an int of at least 1.")
        request = CaptureRequest(steps or self.config.capture_steps, trigger)
        if self._agreement is not None and self._agreement.enabled:
            self._agreement.hold(request)
        else:
            self._planner.request(request.active, request.trigger)

    def data_wait(self, seconds: float) -> None:
        """Add ``seconds`` spent waiting for a batch of the current step."""
        self._data_wait += seconds

    def batch_arrived(self) -> None:
        """A batch of the current step is in hand (for front ends with hooks, not iterators).

        The time since the step began, or since the last ``batch_done()``, counts as data wait.
        """
        self._data_wait += self._clock() - self._wait_from

    def batch_done(self) -> None:
        """A micro-batch of the current step is done; waiting for the next one starts now."""
        self._wait_from = self._clock()

    def pause(self) -> None:
        """Work between steps begins (validation, checkpointing): it belongs to no step."""
        self._paused = True
        if self._auditing:
            self._stop_audit(cancel=True)

    def resume(self) -> None:
        """The work between steps is over: the next step starts timing now."""
        if self._paused:
            self._paused = False
            self._step_start, self._step_start_ns = self._clock(), wall_ns()
            self._wait_from = self._step_start
            self._data_wait = 0.0
            self._after_pause = True

    def step_end(self) -> None:
        """The current optimizer step is complete."""
        now, now_ns = self._clock(), wall_ns()
        self._paused = False
        capture = self._capture
        if capture is not None and capture.recording:
            capture.add_span(self.step, self._step_start_ns, now_ns)
        audited = self._stop_audit(cancel=False) if self._auditing else None
        record = StepRecord(self.step, now - self._step_start, self._data_wait,
                            captured=capture is not None or audited is not None,
                            after_pause=self._after_pause)
        summary = self._times.add(record)
        if summary is not None:
            self._publish_summary(summary)
        for detector in self._detectors:
            for finding in detector.observe(record):
                self._on_detector_finding(finding)
        for finding in audited or ():
            self.emit(finding)
        self.step += 1
        self._begin_step()

    def close(self, *, failed: bool = False) -> None:
        """Stop any capture (exported as partial), flush summaries and finish exports."""
        if not self._opened:
            return
        self._opened = False
        if self._auditing:
            self._stop_audit(cancel=True)
        if self._capture is not None:
            self._finish_capture(partial=True)
        summary = self._times.flush()
        if summary is not None:
            self._publish_summary(summary)
        if self._exporter is not None:
            self._exporter.close(timeout_s=10.0 if failed else 120.0)
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._steps_file is not None:
            self._steps_file.close()

    def _begin_step(self) -> None:
        """Start step ``self.step``; our own bookkeeping before this belongs to no step."""
        if self._file_trigger is not None:
            requested = self._file_trigger.poll(self._step_start)
            if requested is not None:
                self.request_capture(requested or None, trigger="file")
        agreement = self._agreement
        if agreement is not None and self.step % agreement.every == 0 and agreement.enabled:
            agreed = agreement.exchange()
            if agreed is not None:
                self._planner.request(agreed.active, agreed.trigger)
        self._update_capture()
        auditor = self._auditor
        if auditor is not None and auditor.next_step is not None and \
                self.step >= auditor.next_step and self._capture is None:
            self._start_audit(auditor)
        self._step_start, self._step_start_ns = self._clock(), wall_ns()
        self._wait_from = self._step_start
        self._data_wait = 0.0
        self._after_pause = False

    def _update_capture(self) -> None:
        """Open, advance or close the capture window for ``self.step``."""
        phase = self._planner.phase_for(self.step)
        capture = self._capture
        if capture is None and phase is Phase.IDLE:
            return
        if capture is not None and (phase is Phase.IDLE or capture.window != self._planner.window):
            self._finish_capture(partial=False)
            capture = None
        if phase is Phase.IDLE or not self.config.traces_rank(self.rank.rank):
            return
        try:
            if capture is None:
                assert self._planner.window is not None
                capture = self._capture = TraceCapture(self.config.trace, self._planner.window)
            capture.warm_up() if phase is Phase.WARMUP else capture.record()
        except Exception as exc:  # kineto refused (e.g. another profiler is running)
            log.warning("profcallbacks: could not start the profiler at step %d (%s); this "
                        "capture is skipped.", self.step, exc)
            self._capture = None

    def _finish_capture(self, *, partial: bool) -> None:
        capture, self._capture = self._capture, None
        assert capture is not None
        try:
            profiler = capture.stop()
        except Exception as exc:
            log.warning("profcallbacks: stopping the profiler failed (%s); capture dropped.", exc)
            return
        if profiler is None or not capture.spans or self._exporter is None:
            return
        window = capture.window
        info = CaptureInfo(name=window.name + ("-partial" if partial else ""),
                           trigger=window.trigger, first_step=window.first_active,
                           steps=tuple(capture.spans), partial=partial, pid=os.getpid(),
                           tid=self._tid, rank=self.rank, backend=_backend())
        self._exporter.submit(profiler, info)

    def _start_audit(self, auditor: StepAuditor) -> None:
        try:
            auditor.begin_step(self.step)
            self._auditing = True
        except Exception as exc:
            log.warning("profcallbacks: the sync audit failed to start (%s); it is disabled.", exc)
            self._auditor = None

    def _stop_audit(self, *, cancel: bool) -> list[Finding]:
        """End the audit of this step; its findings once the last audited step is done."""
        self._auditing = False
        auditor = self._auditor
        try:
            if auditor is None:
                return []
            if cancel:
                auditor.cancel()
                return []
            findings = list(auditor.end_step(self.step))
            if auditor.next_step is None:
                self._auditor = None
            return findings
        except Exception as exc:
            log.warning("profcallbacks: the sync audit failed (%s); it is disabled.", exc)
            self._auditor = None
            return []

    def _on_detector_finding(self, finding: Finding) -> None:
        self.emit(finding)
        if (finding.kind == "step_slowdown" and self.config.capture_on_slowdown
                and finding.details.get("capture", True)):  # False: the detector's cooldown
            self.request_capture(trigger="slowdown")

    def _publish_summary(self, summary: IntervalSummary) -> None:
        prefix = "profcallbacks" if not self.rank.is_distributed else \
            f"profcallbacks/rank{self.rank.rank}"
        values = metric_names(summary, prefix)
        for detector in self._detectors:  # optional: detectors with scalars() add their values
            extra = getattr(detector, "scalars", None)
            values.update({f"{prefix}/{k}": v for k, v in (extra() if extra else {}).items()})
        sinks: list[MetricsSink] = list(self._metrics_sinks)
        if self._tensorboard is not None:
            sinks.append(self._tensorboard.scalars)
        for sink in sinks:
            try:
                sink(values, summary.last_step)
            except Exception as exc:
                log.warning("profcallbacks: metrics sink %r failed (%s); it is disabled.",
                            sink, exc)
                if sink in self._metrics_sinks:
                    self._metrics_sinks.remove(sink)
                else:
                    self._tensorboard = None
        if self._steps_file is not None:
            try:
                self._steps_file.write(summary, self.rank.rank)
            except OSError as exc:
                log.warning("profcallbacks: cannot write %s (%s); step summaries are no longer "
                            "saved.", self._steps_file.path, exc)
                self._steps_file = None


def _agreement_for(rank: RankInfo, every: int) -> TriggerAgreement | None:
    """Agreement on triggered captures when several ranks share an initialised process group."""
    import torch.distributed as dist

    if not rank.is_distributed:
        return None
    if not (dist.is_available() and dist.is_initialized()):
        log.warning("profcallbacks: WORLD_SIZE=%d but torch.distributed is not initialised when "
                    "profiling starts; triggered captures stay per rank (scheduled ones still "
                    "agree). Initialise the process group first.", rank.world_size)
        return None
    return TriggerAgreement(every)


def _prepare_logdir(logdir: Path) -> Path:
    """Create ``logdir/profcallbacks``; a clear error now instead of a failure mid-training."""
    if logdir.exists() and not logdir.is_dir():
        raise NotADirectoryError(f"logdir={str(logdir)!r} is a file; pass a directory path "
                                 "(it is created if missing).")
    meta = logdir / META_DIR
    try:
        meta.mkdir(parents=True, exist_ok=True)
        probe = meta / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise PermissionError(f"logdir={str(logdir)!r} is not writable ({exc.strerror}); pass a "
                              "directory this process can write to.") from exc
    return meta


def _backend() -> str | None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return str(dist.get_backend())
    return None
