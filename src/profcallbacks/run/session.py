"""The step state machine: step boundaries buffered into blocks, each block handed to the
participants (captures, memory, audit, detectors), driven by plain calls from a front end.

Where the rest lives: the log directory's checks in :mod:`~profcallbacks.run.logdir`, the
block's size in :mod:`~profcallbacks.run.blocks`, the participants in
:mod:`~profcallbacks.run.defaults`, findings' and summaries' way out in
:mod:`~profcallbacks.run.outputs`, compile segmentation in the compile watcher.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterable
from operator import attrgetter, sub
from pathlib import Path

from profcallbacks.capture.controller import CaptureController
from profcallbacks.core import reruns
from profcallbacks.core.device_timing import DeviceClock, DeviceStepTimer
from profcallbacks.core.ranks import RankInfo
from profcallbacks.core.timing import IntervalSummary, StepTimes
from profcallbacks.core.triggers import MANUAL, VALIDATION, CaptureRequest
from profcallbacks.detect.base import Detector, Participant, RecordDetector, StepAuditor
from profcallbacks.detect.compile_watch import CompileWatcher, watch_compile
from profcallbacks.detect.loaders import LoaderPasses, describe_loader
from profcallbacks.findings import Finding, FindingHandler, log_finding
from profcallbacks.options.bounds import check_capture_steps
from profcallbacks.options.profiler import ProfilerConfig
from profcallbacks.run.blocks import NO_WAITS, StepBuffer, block_period_s, next_block_len
from profcallbacks.run.defaults import default_detectors, live_analysis, loader_workers, own_participants
from profcallbacks.run.dispatch import Participants
from profcallbacks.run.logdir import prepare_logdir
from profcallbacks.run.outputs import LateMark, RunOutputs
from profcallbacks.run.participants import StepAudit
from profcallbacks.run.sinks import MetricsSink

log = logging.getLogger(__name__)

Clock = Callable[[], float]
_finding_step = attrgetter("step")


class ProfilingSession(StepBuffer):
    """Turns step boundaries into timings, findings and capture windows.

    Front ends call, in order: ``open()``; per step any number of ``data_wait(seconds)`` (or
    ``batch_arrived()``/``batch_done()``), then ``step_end()``; ``pause()``/``resume()`` around
    work between steps (validation, checkpointing) that must count as no step; ``close()``. A
    step begins at the previous ``step_end()`` (or ``open()``/``resume()``), so its time and its
    ``ProfilerStep#N`` range include fetching its batches.

    Example:
        >>> config = ProfilerConfig(schedule=None, tensorboard_scalars=False)
        >>> session = ProfilingSession(config, getfixture("tmp_path") / "exp1")
        >>> session.open(); session.data_wait(0.002); session.step_end(); session.close()
        >>> session.step, [f.kind for f in session.findings]  # one step: too short to audit
        (1, ['sync_audit'])
    """

    def __init__(self, config: ProfilerConfig, logdir: Path, *, rank: RankInfo | None = None,
                 clock: Clock = time.perf_counter, on_finding: FindingHandler | None = None,
                 detectors: Iterable[Detector | Participant] | None = None,
                 metrics_sinks: Iterable[MetricsSink] = (), start_step: int = 0,
                 auditor: StepAuditor | None = None, log_findings: bool = True) -> None:
        self.config = config
        self.logdir = Path(logdir)
        self.rank = rank or RankInfo.detect()
        StepBuffer.__init__(self, clock, start_step, block_period_s(config))
        self._start_step = start_step
        # log_findings=False (ranks after the world's first): every output but logging
        self._out = RunOutputs(config, self.logdir, self.rank,
                               handlers=([log_finding] if log_findings else [])
                               + ([on_finding] if on_finding else []),
                               metrics_sinks=metrics_sinks, processors=[LateMark(lambda: self.step)])
        self._captures = CaptureController(config, self.logdir, self.rank, analysis=live_analysis())
        # SIGTERM in a window, or while close() waits for the exports: write what is recorded
        self._captures.on_terminate = lambda: self.close(failed=True) if self._opened else self._out.close()
        self._captures.run_findings = lambda: self._out.findings  # each capture's track
        self._participants = Participants(own_participants(
            config, self._captures, self.logdir, self.rank, start_step=start_step, auditor=auditor))
        self._audit = next((p for p in self._participants.members if isinstance(p, StepAudit)), None)
        for detector in (default_detectors(config, self.rank) if detectors is None else detectors):
            self.add_detector(detector)
        steps, min_s = config.summary_every
        self._times = StepTimes(interval=steps, min_s=min_s)
        self._paused = False
        self._device: DeviceClock | None = None  # on CUDA: step_end() marks the step's event
        self._compile: CompileWatcher | None = None  # once torch.compile is in use
        self._opened = False
        self._warned_closed = False
        self._loader_passes = LoaderPasses()
        self.loader_workers = loader_workers(config, lambda: self.step, self._participants,
                                             self._captures)
        """The workers' timing of the loader that ``StepProfiler.wrap`` iterates."""

    @property
    def findings(self) -> list[Finding]:
        """Every finding emitted so far."""
        return self._out.findings

    @property
    def captures(self) -> list[Path]:
        """Capture directories exported so far."""
        return self._captures.captures

    @property
    def export_helper_pid(self) -> int | None:
        """Process id of the export helper while it runs (``None``: none yet, or a thread)."""
        return self._captures.export_helper_pid

    @property
    def captures_started(self) -> int:
        """Capture windows opened so far (they count towards ``max_captures``)."""
        return self._captures.captures_started

    def restore(self, *, captures_started: int) -> None:
        """Continue a resumed run: windows opened before the restart count towards ``max_captures``."""
        self._captures.captures_started = captures_started

    def set_loader(self, loader: object) -> None:
        """Tell the participants which loader feeds the steps (its settings shape their advice).

        Front ends call it before each pass over the loader (``StepProfiler.wrap``, the HF
        callback at each epoch). A pass that starts the workers again (``num_workers > 0``,
        ``persistent_workers=False``) makes its first step a step after a pause: a start-up
        wait, out of the statistics, as an epoch's first step where the front end pauses."""
        try:
            info = describe_loader(loader)
        except Exception as exc:
            log.warning("profcallbacks: cannot read the loader's settings (%s).", exc)
            return
        restart = self._loader_passes.begin(info, self.step) and self._opened and not self._paused
        if restart:  # the steps so far are complete: a block boundary, as at a pause
            now = self._clock()
            self._end_block(now)
        self._participants.set_loader(info, self.step)
        if restart:
            self._begin_block(now, after_pause=True)

    def add_detector(self, detector: Detector | Participant) -> None:
        """Run ``detector`` on every finished step from now on (your own, or a test's recorder).

        A :class:`~profcallbacks.detect.base.Participant` takes whole blocks and may use every
        hook; any other object with ``observe(record)`` is shown one ``StepRecord`` per step.
        """
        self._participants.add(detector if isinstance(detector, Participant)
                               else RecordDetector(detector))

    @property
    def capture_open(self) -> bool:
        """A capture window is open: torch.profiler is running for the current step."""
        return self._captures.window_open

    def add_finding_handler(self, handler: FindingHandler) -> None:
        """Hand every finding from now on to ``handler`` too (a tracker's sink)."""
        self._out.router.add_handler(handler)

    def emit(self, finding: Finding) -> None:
        """Deliver ``finding`` through the processors to every sink (detectors outside the
        step loop use this too); see :class:`~profcallbacks.run.outputs.RunOutputs`."""
        self._out.emit(finding)

    @property
    def is_open(self) -> bool:
        """Between ``open()`` and ``close()``."""
        return self._opened

    def open(self) -> None:
        """Create the log directory and start timing step ``start_step``."""
        reruns.take_over(self.logdir, self)  # closes one a raised training left open here
        prepare_logdir(self.logdir)
        try:
            # every rank first: the trigger agreement is a collective, so a rank that fails below
            # (rank 0 finding the logdir in use) fails alone, not leaving the others waiting in it
            self._captures.open()
            self._out.open()
            if DeviceStepTimer.wanted():  # CUDA events are recorded per step
                self._device = self._step_clock = DeviceClock(self._clock, DeviceStepTimer())
            self._opened = True
            self._watch_compile()
            self._begin_block(self._clock(), after_pause=True)
        except BaseException:
            try:
                self._captures.close(failed=True)  # the export helper does not outlive this
            finally:
                self._out.release_lock()
            raise

    def _watch_compile(self) -> None:
        """Listen to torch.compile once ``torch._dynamo`` is imported: a slowdown at recompiles
        says so (the first processor)."""
        self._compile = watch_compile(rank=self.rank.rank, step_now=self._step_now)
        if self._compile is not None:
            self._out.processors.insert(0, self._compile.explain)

    def _step_now(self) -> int | None:
        """The step in progress, ``None`` between steps (what a compile is attributed to)."""
        return None if self._paused or not self._opened else self.step

    @property
    def compile_s(self) -> float:
        """Seconds torch.compile spent compiling since ``open()``, between steps too."""
        return self._compile.total_s if self._compile is not None else 0.0

    def request_capture(self, steps: int | None = None, trigger: str = MANUAL, *,
                        profile_memory: bool = False) -> None:
        """Capture ``steps`` steps (default ``config.capture_steps``) from the next step on.

        With several ranks the window starts at the next trigger agreement (a step that is a
        multiple of ``max(log_every_n_steps, 10)``), on every rank at once.

        Args:
            steps: Recorded steps (``None``: ``config.capture_steps``).
            trigger: Names the capture directory (one of ``core.triggers.TRIGGERS``).
            profile_memory: The trace records allocations too, whatever ``config.trace`` says.
        """
        check_capture_steps(steps)
        self._request(CaptureRequest(trigger, steps, profile_memory))

    def _request(self, request: CaptureRequest) -> None:
        self._captures.request(request)
        if self._opened and self._n < self._due:
            self._due = self._n + 1  # the block ends with this step: the window opens after it

    @property
    def auditing(self) -> bool:
        """The sync audit watches the current step."""
        audit = self._audit
        return audit is not None and audit.auditing

    def mark_batch(self, batch: object) -> None:
        """``batch`` is the current step's input: while the sync audit watches the step, what
        is computed from it counts as a device value on a CPU run (it would be on the device)."""
        if self._audit is not None:
            self._audit.mark_batch(batch)

    def pause(self, activity: str | None = None) -> None:
        """Work between steps begins (validation, checkpointing): it belongs to no step.

        ``activity="validation"`` with ``config.capture_validation`` captures the work in a
        window of its own (``stepNNNNNN-validation``) unless a training window is open.
        """
        if self._opened and not self._paused:
            now = self._clock()
            self._end_block(now)  # the steps so far are complete: a block boundary
            self._ends[0] = now  # a step_end() without resume() times from here
            self._due = 1
        if (activity == VALIDATION and self.config.capture_validation and not self._paused
                and self._opened):
            self._captures.begin_between_steps(self.step, VALIDATION)
        self._paused = True
        self._participants.pause(self.step)

    def resume(self) -> None:
        """The work between steps is over: the next step starts timing now."""
        if self._paused:
            self._paused = False
            if self._device is not None:
                self._device.break_chain()
            self._captures.end_between_steps()
            if self._opened:
                self._begin_block(self._clock(), after_pause=True)

    @property
    def tracing(self) -> bool:
        """A capture window is recording this step (front ends mark their fetches in it)."""
        capture = self._captures.active
        return capture is not None and capture.recording

    def on_exception(self, error: BaseException) -> None:
        """A step raised ``error``: an ``out_of_memory`` finding if it is one (before ``close``)."""
        if not self._opened:
            return
        for finding in self._participants.on_exception(self.step, error):
            self.emit(finding)

    def close(self, *, failed: bool = False) -> None:
        """Stop any capture (exported as partial), flush summaries and finish exports."""
        if not self._opened:
            return
        if not self._paused:
            self._end_block(self._clock())
        self._opened = False
        self._due = 0
        try:
            # the step rows reach the disk first: the wait for exports below may end in the
            # launcher's SIGKILL (torchrun, Slurm), and the rows are what the report reads
            summary = self._times.flush()
            if summary is not None and self._out.publishing:
                self._publish(summary, summary.last_step, self._clock())
            self._out.write_pending()
            self._participants.close(failed=failed)
            if self._audit is not None and self.step > self._start_step:
                self._audit.finish(self.step - 1)  # a round cut short, or a check that did not run
            self._emit_taken_findings()
        finally:
            if self._compile is not None:
                self._compile.uninstall()
            self._out.close()
            reruns.release(self.logdir, self)

    def __del__(self) -> None:
        """Collected while open (abandoned by an exception): close, with one warning."""
        if getattr(self, "_opened", False) and not sys.is_finalizing():
            log.warning("profcallbacks: a profiler on %s was never closed and is collected; it "
                        "is closed now.", self.logdir)
            with contextlib.suppress(Exception):  # never raise from the collector
                self.close(failed=True)

    def _block_boundary(self, now: float) -> None:
        """A block is complete or a step needs attention: process the block, begin the next."""
        if not self._opened:
            self._n = 0
            if not self._warned_closed:
                log.warning("profcallbacks: step() called while the profiler is not running "
                            "(use `with prof:` or call it between open and close); ignored.")
                self._warned_closed = True
            return
        if self._from_another_thread():
            return
        self._paused = False
        self._end_block(now)
        self._begin_block(now, after_pause=False)

    def _end_block(self, now: float) -> None:
        """Hand the buffered steps to the summaries and the participants, in step order."""
        n = self._n
        if n == 0:
            return
        ends, first, excluded = self._ends, self._first, self._block_excluded
        ended = self._participants.end_block(first)
        after_pause = self._block_after_pause
        times = list(map(sub, ends[1:n + 1], ends[:n]))  # one list per block, no object per step
        waits = self._waits[1:n + 1]
        self._first = first + n
        self._n = 0
        self._block_len = next_block_len(times, self._block_s)
        if self._compile is None and "torch._dynamo" in sys.modules:
            self._watch_compile()  # torch.compile was first called after open()
        watch = self._compile
        found: list[Finding] = []
        # steps that compiled are handed over alone, as excluded steps
        for a, b, part_excluded, compile_s in (watch.segments(first, n, excluded) if watch
                                               else ((0, n, excluded, 0.0),)):
            found += self._hand_over(first + a, times[a:b], waits[a:b], part_excluded,
                                     after_pause and a == 0, first + n - 1, now, compile_s)
        if watch is not None and (watch.pending or watch.poll):
            found += watch.drain()
        found.sort(key=_finding_step)  # stable: per step in participant order, as step by step
        for finding in found + ended:
            self._on_finding(finding)
        self._emit_taken_findings()

    def _hand_over(self, first: int, times: list[float], waits: list[float], excluded: bool,
                   after_pause: bool, last: int, now: float,
                   compile_s: float = 0.0) -> list[Finding]:
        """Consecutive steps from ``first`` to the summaries and the participants; their findings.

        ``last``: the block's last step, ended at ``now``: memory read now is that step's, in
        whichever summary carries it (dated earlier, it would bend the growth rate)."""
        summaries = self._times.add_block(first, times, waits, excluded, compile_s)
        if self._out.publishing:
            for i, summary in enumerate(summaries, 1):  # memory with the latest of them
                self._publish(summary, last, now, sample=i == len(summaries))
        return self._participants.observe_block(first, times, waits, excluded, after_pause)

    def _begin_block(self, now: float, *, after_pause: bool) -> None:
        """Start a block at step ``self.step``; our own bookkeeping belongs to no step."""
        step = self._first
        found, excluded, boundary = self._participants.begin_block(step, now)
        for finding in found:
            self.emit(finding)
        self._block_excluded = excluded
        self._block_after_pause = after_pause
        self._due = max(1, min(self._block_len, boundary - step))
        self._waits[1:] = NO_WAITS  # waits added while paused belong to no step
        self._ends[0] = self._wait_from = self._clock()

    def _emit_taken_findings(self) -> None:
        """Findings made elsewhere (the export helper's), emitted on this thread."""
        for finding in self._participants.take_findings():
            self._on_finding(finding)

    def _on_finding(self, finding: Finding) -> None:
        self.emit(finding)
        if finding.capture is not None:  # the participant asks for a capture with this finding
            self._request(finding.capture)

    def _publish(self, summary: IntervalSummary, step: int, now: float, *, sample: bool = True) -> None:
        """Hand ``summary`` to the sinks with a memory sample (if ``sample`` and due: read now,
        at ``now``, after step ``step``), then its findings."""
        memory, findings = self._participants.summary_sample(step, now) if sample else ({}, [])
        extra = self._participants.scalars(self.step)  # and the device step time (CUDA)
        self._out.publish(summary, extra | (self._device.scalars() if self._device else {}), memory)
        for finding in findings:
            self._on_finding(finding)
