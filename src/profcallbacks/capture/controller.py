"""Capture windows for one session: planner, triggers, the running profiler and the exporter."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from profcallbacks.capture.agreement import TriggerAgreement
from profcallbacks.capture.budget import CaptureBudget
from profcallbacks.capture.capture_file import CaptureFileTrigger
from profcallbacks.capture.exporter import TraceExporter
from profcallbacks.capture.findings_track import MAX_FINDINGS
from profcallbacks.capture.planner import CapturePlanner, Window
from profcallbacks.capture.trace_capture import TraceCapture, wall_ns
from profcallbacks.capture.trace_writer import CaptureHook, remove_raw
from profcallbacks.core.capture_info import CaptureInfo
from profcallbacks.core.ranks import RankInfo
from profcallbacks.core.signals import TerminationGuard, held_signals
from profcallbacks.core.triggers import FILE, CaptureRequest
from profcallbacks.findings import Finding
from profcallbacks.layout import trace_file_name
from profcallbacks.options.profiler import ProfilerConfig
from profcallbacks.options.schedule import Phase
from profcallbacks.options.trace import TraceOptions

log = logging.getLogger(__name__)

CLOSE_WAIT_S = 120.0
"""Seconds the end of a run waits for its exports; a trace not written by then is published raw."""
CLOSE_WAIT_FAILED_S = 10.0
"""The same wait when the run ends with an error."""
CLOSE_OWED_FAILED_S = 5.0
"""When the run ends with an error, how long the export helper waits for files that other live
ranks still owe a capture (none owed: no wait) before publishing it as partial."""
MIN_AGREE_EVERY = 10  # steps between trigger agreements, at least (they are collectives)


class CaptureController:
    """Opens, advances and closes capture windows at step boundaries.

    Requests (``request()``, the CAPTURE file) go to the planner, or, with several ranks, through
    a :class:`TriggerAgreement` so every rank opens the same window. Outside windows
    ``begin_step`` is a few comparisons.

    Example:
        >>> controller = CaptureController(ProfilerConfig(), Path("runs/x"), RankInfo())
        >>> controller.open(); controller.begin_step(0, now=0.0)       # doctest: +SKIP
    """

    def __init__(self, config: ProfilerConfig, logdir: Path, rank: RankInfo, *,
                 analysis: CaptureHook | None = None) -> None:
        self._config = config
        self._analysis = analysis  # run by the export helper on each published capture, or None
        self._logdir = logdir
        self._rank = rank
        self._planner = CapturePlanner(config.schedule, max_captures=config.max_captures)
        self._traces = config.traces_rank(rank.rank)
        self._capture: TraceCapture | None = None
        self._exporter: TraceExporter | None = None
        self._file_trigger: CaptureFileTrigger | None = None
        self._agreement: TriggerAgreement | None = None
        self._tid = 0
        self._between: tuple[int, int] | None = None  # step and start of a capture between steps
        self._refused: Window | None = None  # the profiler would not start for this window
        self._broken = False
        self._agreed_step = -1
        self._retired: list[Any] = []  # exported profilers, their events freed between steps
        budget = config.budget.capture_bytes if config.budget is not None else None
        self._budget = CaptureBudget(budget) if budget is not None else None
        self.on_terminate: Callable[[], None] = lambda: self.close(failed=True)
        """What a default-disposition SIGTERM runs while a window is open, or while ``close``
        waits for the exports (the session sets it)."""
        self._guard = TerminationGuard(lambda: self.on_terminate(), message=(
            "the open capture is stopped and published as -partial"))
        self._closing_guard = TerminationGuard(lambda: self.on_terminate(), message=(
            "step summaries and findings are written; the export helper finishes the captures"))
        self.run_findings: Callable[[], list[Finding]] = list
        """The run's findings so far (the session sets it): each capture's track shows them."""
        self.loader_batches: Callable[[float, float], list[Any]] | None = None
        """The loader workers' timed batches between two perf_counter times (their tracks)."""

    def release_retired(self) -> None:
        """Free the events the last exported profiler recorded (at a pause, a new window or the
        end: not in the middle of training steps).

        Freeing them takes about a quarter of their stop and export (0.4 s for a 60 MB trace),
        and torch's profiler holds them in a reference cycle, so if simply dropped they are
        freed by the collector in whichever training step it next runs. torch's own scheduled
        profiler keeps them until its next cycle as well.
        """
        retired, self._retired = self._retired, []
        for profiler in retired:
            with contextlib.suppress(Exception):  # torch's attribute; never worth a failure
                profiler.profiler = None  # the autograd profiler, with kineto's results

    @property
    def captures(self) -> list[Path]:
        """Capture directories exported so far."""
        return list(self._exporter.exported) if self._exporter else []

    @property
    def captures_started(self) -> int:
        return self._planner.captures_started

    @captures_started.setter
    def captures_started(self, value: int) -> None:
        self._planner.captures_started = value

    @property
    def active(self) -> TraceCapture | None:
        """The running capture, if a window is open."""
        return self._capture

    @property
    def window_open(self) -> bool:
        """torch.profiler runs for the current step."""
        return self._capture is not None

    @property
    def affects_steps(self) -> bool:
        """Step times are not the job's own: a window is open, or an export runs on a thread of
        this process (the fallback when no helper process can start; it takes the GIL).

        An export in the helper process (the normal case) does not count: it runs at the lowest
        CPU priority and never holds this process's GIL, so the steps meanwhile are the job's own,
        and a slow export on a busy machine must not blind the detectors for its whole duration.
        """
        exporter = self._exporter
        return self._capture is not None or (exporter is not None and exporter.busy
                                             and exporter.in_process)

    def boundary_step(self, step: int) -> int:
        """The next step after ``step`` whose ``begin_step`` must run (a window or agreement)."""
        planner = self._planner
        if self._capture is not None or planner.window is not None or planner.has_pending:
            return step + 1
        due = planner.next_due
        agreement = self._agreement
        if agreement is not None and agreement.enabled:
            due = min(due, (step // agreement.every + 1) * agreement.every)
        return due

    @property
    def export_helper_pid(self) -> int | None:
        """Process id of the export helper while it runs (``None``: none, or exports on a thread)."""
        return self._exporter.helper_pid if self._exporter is not None else None

    def take_findings(self) -> list[Finding]:
        """Findings the exporter made about published captures since the last call."""
        return self._exporter.take_findings() if self._exporter is not None else []

    def open(self) -> None:
        config, rank = self._config, self._rank
        if config.watch_capture_file and rank.rank == 0:
            self._file_trigger = CaptureFileTrigger(self._logdir, poll_s=config.capture_file_poll_s)
        tracing = sum(config.traces_rank(r) for r in range(rank.world_size))
        self._exporter = TraceExporter(self._logdir, tracing_ranks=max(tracing, 1),
                                       analysis=self._analysis, budget=config.budget)
        if self._traces:  # the helper starts now, not inside the run's first window
            self._exporter.prepare()
        self._agreement = _agreement_for(rank, max(config.summary_every[0], MIN_AGREE_EVERY))
        early = self._planner.take_pending() if self._agreement is not None else None
        if early is not None and self._agreement is not None:  # asked for before training began
            self._agreement.hold(early)
        self._tid = threading.get_native_id()

    def request(self, request: CaptureRequest) -> None:
        """A window of ``request.steps`` recorded steps (``None``: ``capture_steps``), from the
        next step (or agreement step) on."""
        if request.steps is None:
            request = replace(request, steps=self._config.capture_steps)
        if self._agreement is not None and self._agreement.enabled:
            self._agreement.hold(request)
        else:
            self._planner.request(request.steps or 1, request.trigger,
                                  profile_memory=request.profile_memory)

    def begin_step(self, step: int, now: float) -> None:
        """Take triggers into account and move the window to ``step``; never raises."""
        if self._broken:
            return
        try:
            self._begin_step(step, now)
        except Exception as exc:  # e.g. a file system or process-group error: stop capturing
            log.warning("profcallbacks: captures failed at step %d (%s: %s) and are off for the "
                        "rest of the run; step timing and findings go on.", step,
                        type(exc).__name__, exc)
            self._broken = True
            self.finish(partial=True)

    def _begin_step(self, step: int, now: float) -> None:
        trigger = self._file_trigger
        if trigger is not None and now >= trigger.next_poll:  # checked inline: every step
            requested = trigger.poll(now)
            if requested is not None:
                self.request(CaptureRequest(FILE, requested or None))
        agreement = self._agreement
        if (agreement is not None and step % agreement.every == 0 and agreement.enabled
                and step != self._agreed_step):  # once per step, also across pause/resume
            self._agreed_step = step
            agreed = agreement.exchange()
            if agreed is not None:
                self._planner.request(agreed.steps or 1, agreed.trigger,
                                      profile_memory=agreed.profile_memory)
        capture = self._capture
        if capture is not None and capture.measure_first and capture.spans:
            self._measure_first_step(capture)  # before the phase: it may change the window
            capture = self._capture
        phase = self._planner.phase_for(step)
        if capture is None and phase is Phase.IDLE:
            return
        if capture is not None and (phase is Phase.IDLE or capture.window != self._planner.window):
            self.finish(partial=False)
            capture = None
        window = self._planner.window
        if phase is Phase.IDLE or not self._traces or window is None or window == self._refused:
            return
        try:
            if capture is None:
                self.release_retired()  # inside a profiled step anyway
                options = _options(self._config, window)
                measure_first = False
                if self._budget is not None:
                    self._budget.published(self.captures)
                    window, options, measure_first = self._budget.before_window(window, options)
                    self._planner.shorten(window)
                capture = self._capture = TraceCapture(options, window,
                                                       measure_first=measure_first)
                self._owe(window)
                self._guard.arm()
                self._tid = threading.get_native_id()  # the thread that steps: its ops' tid
                if self._exporter is not None and self._exporter.busy:
                    capture.overlaps_export = True  # its trace and the report say so
                    log.info("profcallbacks: capture %s starts while the previous capture is "
                             "still being exported; its trace is marked (export_overlap).",
                             window.dir_name())
            with held_signals():  # never half started
                capture.warm_up() if phase is Phase.WARMUP else capture.record()
        except Exception as exc:  # kineto refused (e.g. another profiler is running)
            log.warning("profcallbacks: could not start the profiler at step %d (%s); this "
                        "capture is skipped.", step, exc)
            self._refused = window
            self.finish(partial=False)

    def begin_between_steps(self, step: int, trigger: str) -> None:
        """Capture work between steps (e.g. validation) as a window of its own, if none is open."""
        if self._capture is not None or not self._traces:
            return
        if self._planner.captures_started >= self._config.max_captures:
            return
        self._planner.captures_started += 1
        try:
            self._capture = TraceCapture(self._config.trace, Window(step, 0, 1, trigger))
            self._owe(self._capture.window)
            self._guard.arm()
            with held_signals():
                self._capture.record()
        except Exception as exc:
            log.warning("profcallbacks: could not start the profiler for %s at step %d (%s); "
                        "this capture is skipped.", trigger, step, exc)
            self.finish(partial=False)  # stops a profiler that got as far as warming up
            return
        self._between = (step, wall_ns())

    def end_between_steps(self) -> None:
        """The work between steps is over: export its capture as one ``ProfilerStep#N`` range."""
        if self._between is None or self._capture is None:
            return
        (step, start_ns), self._between = self._between, None
        self._capture.add_span(step, start_ns, wall_ns())
        try:
            self.finish(partial=False)
        except Exception as exc:  # e.g. the export thread cannot start: training goes on
            log.warning("profcallbacks: the capture between steps at step %d could not be "
                        "exported (%s).", step, exc)

    def finish(self, *, partial: bool) -> None:
        """Stop the running capture and queue what it recorded for export."""
        capture, self._capture = self._capture, None
        self._between = None
        if capture is None:
            return
        try:
            with held_signals():  # a signal now would leave kineto half stopped, the trace lost
                self._stop_and_submit(capture, partial=partial)
        finally:
            self._guard.disarm()

    def _measure_first_step(self, capture: TraceCapture) -> None:
        """Save the first recorded step of the run's first capture on its own, learn its size,
        and go on with the window trimmed to fit (``CaptureBudget.first_step_saved``).

        Signals wait until the capture is whole again (its first step saved and kept, or
        dropped): a Ctrl-C then publishes what was recorded, as at any other stop."""
        assert self._budget is not None and self._exporter is not None
        with held_signals():
            try:
                profiler = capture.cut()
                saved = self._exporter.save(profiler, self._info(capture, partial=False))
                self._retired.append(profiler)
            except Exception as exc:
                log.warning("profcallbacks: stopping the profiler failed (%s); capture dropped.",
                            exc)
                saved = None
            if saved is None:  # logged; the rest of this window is not recorded
                self._paid(capture.window)
                self._refused = capture.window
                self._capture = None
                self._guard.disarm()
                return
            window, options, keep = self._budget.first_step_saved(
                capture.window, capture.options, *saved)
            if keep:
                capture.pieces.append(saved)
            else:
                remove_raw(saved[0])
                capture.spans.clear()
            self._planner.shorten(window)
            capture.go_on(options, window)

    def _stop_and_submit(self, capture: TraceCapture, *, partial: bool) -> None:
        pieces = capture.pieces
        try:
            profiler = capture.stop()
            if profiler is not None and capture.spans and self._exporter is not None:
                saved = self._exporter.save(profiler, self._info(capture, partial=partial))
                self._retired.append(profiler)  # freed between steps, not in this one
                pieces = [*pieces, saved] if saved is not None else []
        except Exception as exc:
            log.warning("profcallbacks: stopping the profiler failed (%s); capture dropped.", exc)
            pieces = []
        if not capture.spans or self._exporter is None or not pieces:
            for raw, _ in capture.pieces:
                remove_raw(raw)
            self._paid(capture.window)  # no file of this rank: the others wait for none
            return
        raw_bytes = sum(size for _, size in pieces)
        info = replace(self._info(capture, partial=partial),
                       pieces=tuple(str(raw) for raw, _ in pieces[:-1]),
                       budget=self._budget.metadata(capture.window) if self._budget else None,
                       findings=self._track_findings(),
                       loader=self._worker_spans(capture))
        self._exporter.queue(pieces[-1][0], raw_bytes, info)
        if self._budget is not None:
            self._budget.recorded(info.name, trace_file_name(self._rank.worker, info.first_step),
                                  capture.options, steps=len(capture.spans), raw_bytes=raw_bytes)

    def _worker_spans(self, capture: TraceCapture) -> tuple[tuple[int, int, str, int, int], ...]:
        """The loader workers' spans of the capture's steps, for their tracks."""
        if self.loader_batches is None or not capture.spans:
            return ()
        try:
            from profcallbacks.capture.worker_tracks import worker_spans

            return worker_spans(self.loader_batches, capture.spans[0].start_ns,
                                capture.spans[-1].end_ns)
        except Exception as exc:  # the tracks are never worth the capture
            log.warning("profcallbacks: the loader workers' tracks are left out (%s).", exc)
            return ()

    def _owe(self, window: Window) -> None:
        """This rank will write a file of ``window``'s capture: ranks that publish it wait for it."""
        if self._exporter is not None:
            self._exporter.owe(window.dir_name())

    def _paid(self, window: Window) -> None:
        if self._exporter is not None:
            self._exporter.paid(window.dir_name())

    def _track_findings(self) -> tuple[dict[str, Any], ...]:
        """This rank's latest findings, as the capture's findings track takes them."""
        try:
            mine = [f for f in self.run_findings() if f.rank == self._rank.rank]
            return tuple(f.to_dict() for f in mine[-MAX_FINDINGS:])
        except Exception as exc:  # the track is never worth the capture
            log.warning("profcallbacks: the findings track is left out (%s).", exc)
            return ()

    def _info(self, capture: TraceCapture, *, partial: bool) -> CaptureInfo:
        window = capture.window
        return CaptureInfo(name=window.dir_name(partial=partial),
                           trigger=window.trigger, first_step=window.first_active,
                           steps=tuple(capture.spans), partial=partial, pid=os.getpid(),
                           tid=self._tid, rank=self._rank, backend=_backend(),
                           export_overlap=capture.overlaps_export, cpu=capture.cpu_figures())

    def close(self, *, failed: bool) -> None:
        """Export a window still open as partial, then wait for the exports to finish."""
        try:
            self.finish(partial=True)
        except Exception as exc:  # e.g. the export thread cannot start: the run still ends
            log.warning("profcallbacks: the last capture could not be exported (%s).", exc)
        finally:  # also after a Ctrl-C held during the stop: what was recorded is published
            self.release_retired()
            if self._exporter is not None:
                # a launcher's SIGTERM during the wait (torchrun stops the ranks left when one
                # died) still ends the process, after on_terminate; the helper lives on and
                # finishes what it was given
                self._closing_guard.arm()
                try:
                    if failed:
                        self._exporter.close(timeout_s=CLOSE_WAIT_FAILED_S, publish_timeout_s=0.0,
                                             owed_timeout_s=CLOSE_OWED_FAILED_S)
                    else:
                        self._exporter.close(timeout_s=CLOSE_WAIT_S)
                finally:
                    self._closing_guard.disarm()


def _options(config: ProfilerConfig, window: Window) -> TraceOptions:
    """A window asked for with ``profile_memory`` records allocations too (the Memory view)."""
    if window.profile_memory and not config.trace.profile_memory:
        return replace(config.trace, profile_memory=True)
    return config.trace


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


def _backend() -> str | None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return str(dist.get_backend())
    return None
