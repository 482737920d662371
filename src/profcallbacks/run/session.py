"""The orchestrator: step timing, and the participants (captures, memory, audit, detectors) run
between blocks of steps, driven by plain calls from a front end."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from operator import attrgetter, sub
from pathlib import Path

from profcallbacks.capture.controller import CaptureController
from profcallbacks.core import reruns
from profcallbacks.core.device_timing import DeviceStepTimer
from profcallbacks.core.ranks import RankInfo
from profcallbacks.core.safefs import UnsafeEntryError, ensure_dir, fresh_name, warn_if_shared, write_new
from profcallbacks.core.timing import IntervalSummary, StepTimes
from profcallbacks.core.triggers import MANUAL, VALIDATION, CaptureRequest
from profcallbacks.detect.base import (
    NEVER,
    Detector,
    Participant,
    RecordDetector,
    StepAuditor,
    defining,
)
from profcallbacks.detect.compile_watch import CompileWatcher
from profcallbacks.detect.loaders import describe_loader
from profcallbacks.findings import (
    Finding,
    FindingHandler,
    FindingRouter,
    FindingsFile,
    log_finding,
    reported_late,
)
from profcallbacks.layout import META_DIR, findings_file, new_run_id, run_specific_file, steps_file
from profcallbacks.options.bounds import check_capture_steps
from profcallbacks.options.profiler import ProfilerConfig
from profcallbacks.run.defaults import default_auditor, default_detectors
from profcallbacks.run.memory_monitor import MemoryMonitor
from profcallbacks.run.participants import BaselineRule, CaptureWindows, MemoryWork, StepAudit
from profcallbacks.run.runlock import RunLock, claim_logdir
from profcallbacks.run.sinks import MetricsSink, StepsFile, SummaryPublisher, TensorBoardWriter

log = logging.getLogger(__name__)

Clock = Callable[[], float]
LIVE_ANALYSIS = "profcallbacks.report.live:capture_findings"
"""Run by the export helper on each published capture: ``capture_verdict``, ``slowdown_diagnosis``."""
BLOCK_STEPS = 128
"""Most steps in a block: detectors, summaries and triggers run once per block."""
_finding_step = attrgetter("step")
_NO_WAITS = [0.0] * BLOCK_STEPS
_BLOCK_HOOKS = ("begin_block", "disturbs_steps", "boundary_step", "end_block", "observe_block",
                "take_findings", "summary_sample", "scalars", "pause")
"""The hooks called between blocks and at pauses: each only on the participants that define it."""
BLOCK_S = 0.25
"""Target seconds per block: blocks of slow steps are shorter (at least one step). A shorter
``capture_file_poll_s`` or memory ``sample_every_s`` shortens blocks to that period."""


class ProfilingSession:
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
        self._clock = clock
        self._step_clock = clock  # read by step_end(); on CUDA it also marks the step's event
        self._metrics_sinks = list(metrics_sinks)
        # log_findings=False: findings still reach files, TensorBoard and on_finding, not logging
        # (front ends pass it on ranks other than the world's first, so only one process prints)
        self._router = FindingRouter(([log_finding] if log_findings else [])
                                     + ([on_finding] if on_finding else []))
        self._captures = CaptureController(config, self.logdir, self.rank, analysis=LIVE_ANALYSIS)
        self._captures.on_terminate = lambda: self.close(failed=True)  # SIGTERM in a window
        self._captures.run_findings = lambda: self._router.findings  # each capture's track
        self._participants = self._own_participants(start_step, auditor)
        self._hooks: dict[str, list[Participant]] = {}
        self._audit = next((p for p in self._participants if isinstance(p, StepAudit)), None)
        for detector in (default_detectors(config, self.rank) if detectors is None else detectors):
            self.add_detector(detector)
        self._participants_changed()
        steps, min_s = config.summary_every
        self._times = StepTimes(interval=steps, min_s=min_s)
        self._tensorboard: TensorBoardWriter | None = None
        self._publisher: SummaryPublisher | None = None
        self._findings_file: FindingsFile | None = None
        self._lock: RunLock | None = None
        self._left_shared = False  # the lock was taken over: own files from then on
        # The block buffer: _ends[0] is when the block's first step began, _ends[k] when its
        # k-th step ended (stored by step_end()); _waits[k] that step's data wait (added to by
        # data_wait() and batch_arrived(), zeroed when a block begins).
        self._ends = [0.0] * (BLOCK_STEPS + 1)
        self._waits = [0.0] * (BLOCK_STEPS + 1)
        self._n = 0  # steps in the block so far
        self._due = 0  # step_end() takes the slow path when _n reaches this (0: not open)
        self._first = start_step  # number of the block's first step
        self._start_step = start_step
        self._block_excluded = False
        self._block_after_pause = True
        self._block_len = 1  # the first block is one step: then the step rate is known
        periods = [BLOCK_S]  # a block lasts no longer than the period of anything polled
        if config.watch_capture_file:
            periods.append(config.capture_file_poll_s)
        if config.memory is not None:
            periods.append(config.memory.sample_every_s)
        self._block_s = min(periods)
        self._wait_from = 0.0
        self._paused = False
        self._device_timer: DeviceStepTimer | None = None
        self._compile: CompileWatcher | None = None  # once torch.compile is in use
        self._opened = False
        self._warned_closed = False
        self._loader_passes = 0  # passes over the loader (set_loader calls with steps between)
        self._latest_finding_step = -1  # the latest step of a finding emitted so far
        self._loader_step: int | None = None  # the step in progress at the last set_loader
        self._stepper: threading.Thread | None = None  # the thread that steps (its boundaries)
        self._warned_threads = False

    def _own_participants(self, start_step: int, auditor: StepAuditor | None) -> list[Participant]:
        """The session's participants, in the order every hook runs (the detectors follow):

        1. the baseline rule: it asks for its capture before the window opens at a boundary;
        2. the capture windows: they open and close at the boundary (``end_block`` ends a
           window step's span first, before any other bookkeeping);
        3. the memory work: it looks at the window just opened, and its spy enters before the
           audit's (dispatch modes leave in the order they came; ``close`` runs in reverse);
        4. the sync audit: it starts only outside capture windows, and stops first at the end
           of its step, before any detector work.
        """
        config = self.config
        participants: list[Participant] = []
        slowdown = config.slowdown
        if config.baseline_capture and slowdown is not None and config.capture_on_slowdown:
            participants.append(BaselineRule(self._captures, start_step + slowdown.warmup_steps + 1))
        participants.append(CaptureWindows(self._captures))
        if config.memory is not None:
            participants.append(MemoryWork(MemoryMonitor(config.memory, self.logdir,
                                                         rank=self.rank.rank), self._captures))
        auditor = auditor if auditor is not None else default_auditor(config, self.rank)
        if auditor is not None:
            participants.append(StepAudit(auditor, self._captures))
        return participants

    @property
    def step(self) -> int:
        """Number of the step in progress (steps are numbered from ``start_step``)."""
        return self._first + self._n

    @property
    def findings(self) -> list[Finding]:
        return self._router.findings

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

        Front ends call it again before each further pass over the loader (``StepProfiler.wrap``
        does, the HF callback at each epoch). When that pass starts the loader's workers again
        (``num_workers > 0``, ``persistent_workers=False``), its first step waits for their
        start-up: it counts as a step after a start or a pause (a start-up wait, out of the
        statistics), as an epoch's first step does where the front end pauses between epochs.
        """
        try:
            info = describe_loader(loader)
        except Exception as exc:
            log.warning("profcallbacks: cannot read the loader's settings (%s).", exc)
            return
        new_pass = self._loader_step is None or self.step > self._loader_step  # steps since
        self._loader_passes += new_pass
        self._loader_step = self.step
        info["passes"] = self._loader_passes
        restart = (new_pass and self._loader_passes > 1 and bool(info.get("num_workers"))
                   and not info.get("persistent_workers") and self._opened and not self._paused)
        if restart:  # the steps so far are complete: a block boundary, as at a pause
            now = self._clock()
            self._end_block(now)
        for participant in list(self._participants):
            try:
                participant.set_loader(info)
            except Exception as exc:  # a participant never stops training
                self._disable(participant, self.step, exc)
        if restart:
            self._begin_block(now, after_pause=True)

    def add_detector(self, detector: Detector | Participant) -> None:
        """Run ``detector`` on every finished step from now on (your own, or a test's recorder).

        A :class:`~profcallbacks.detect.base.Participant` takes whole blocks and may use every
        hook; any other object with ``observe(record)`` is shown one ``StepRecord`` per step.
        """
        self._participants.append(detector if isinstance(detector, Participant)
                                  else RecordDetector(detector))
        self._participants_changed()

    def _participants_changed(self) -> None:
        """Note, per hook run at block boundaries, which participants define it (the others'
        defaults do nothing): those are the ones called."""
        self._hooks = {hook: defining(self._participants, hook) for hook in _BLOCK_HOOKS}

    @property
    def capture_open(self) -> bool:
        """A capture window is open: torch.profiler is running for the current step."""
        return self._captures.window_open

    def add_finding_handler(self, handler: FindingHandler) -> None:
        """Hand every finding from now on to ``handler`` too (a tracker's sink)."""
        self._router.add_handler(handler)

    def emit(self, finding: Finding) -> None:
        """Deliver ``finding`` to every sink (detectors outside the step loop use this too).

        One that comes after findings of later steps (a verdict the export helper made for an
        earlier capture) carries ``details["reported_at_step"]``: logs and findings files are
        streams, so it says where the run was when it came.
        """
        if self._lock is not None and self._lock.lost and not self._left_shared:
            self._leave_shared_files(self._lock)
        latest = self._latest_finding_step
        if finding.step < latest:
            finding = reported_late(finding, max(latest, self.step - 1))
        else:
            self._latest_finding_step = finding.step
        self._router.emit(finding)

    @property
    def is_open(self) -> bool:
        """Between ``open()`` and ``close()``."""
        return self._opened

    def open(self) -> None:
        """Create the log directory and start timing step ``start_step``."""
        reruns.take_over(self.logdir, self)  # closes one a raised training left open here
        _prepare_logdir(self.logdir)
        try:
            # every rank first: the trigger agreement is a collective, so a rank that fails
            # below (rank 0 finding the logdir in use) fails alone instead of leaving the others
            # waiting in it
            self._captures.open()
            self._lock = claim_logdir(self.logdir) if self.rank.rank == 0 else None
            self._open()
        except BaseException:
            try:
                self._captures.close(failed=True)  # the export helper does not outlive this
            finally:
                self._release_lock()
            raise

    def _open(self) -> None:
        rank = self.rank.rank
        self.run_id = new_run_id()
        self._findings_file = FindingsFile(findings_file(self.logdir, rank), self.run_id)
        self._router.add_handler(self._findings_file)
        if self.config.tensorboard_scalars:
            self._tensorboard = TensorBoardWriter(self.logdir)
            self._tensorboard.start()  # import and create now, not inside a timed step
            self._router.add_handler(self._tensorboard.finding)
        prefix = f"profcallbacks/rank{rank}" if self.rank.is_distributed else "profcallbacks"
        self._publisher = SummaryPublisher(prefix, rank=rank, sinks=self._metrics_sinks,
                                           tensorboard=self._tensorboard,
                                           steps_file=StepsFile(steps_file(self.logdir, rank),
                                                                run_id=self.run_id))
        self._device_timer = DeviceStepTimer() if DeviceStepTimer.wanted() else None
        if self._device_timer is not None:  # CUDA events are recorded per step
            self._step_clock = self._device_step_clock
        self._opened = True
        self._watch_compile()
        self._begin_block(self._clock(), after_pause=True)

    def _watch_compile(self) -> None:
        """Listen to torch.compile's events once ``torch._dynamo`` is imported (by ``torch.compile``)."""
        watcher = CompileWatcher(rank=self.rank.rank, step_now=_weak_step_now(self))
        try:
            if watcher.install():
                self._compile = watcher
        except Exception as exc:  # never stops training: compile events are off
            watcher.uninstall()
            log.warning("profcallbacks: cannot follow torch.compile's events (%s); they are off.",
                        exc)
            self._compile = CompileWatcher(rank=self.rank.rank, step_now=_weak_step_now(self))

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

    def data_wait(self, seconds: float) -> None:
        """Add ``seconds`` spent waiting for a batch of the current step."""
        self._waits[self._n + 1] += seconds  # the current step's slot: step_end() stores none

    def batch_arrived(self) -> None:
        """A batch of the current step is in hand (for front ends with hooks, not iterators).

        The time since the step began, or since the last ``batch_done()``, counts as data wait.
        """
        began = self._ends[self._n]
        self._waits[self._n + 1] += (self._clock()
                                     - (began if began > self._wait_from else self._wait_from))

    @property
    def auditing(self) -> bool:
        """The sync audit watches the current step."""
        audit = self._audit
        return audit is not None and audit.auditing

    def mark_batch(self, batch: object) -> None:
        """``batch`` is the current step's input: while the sync audit watches the step, what
        is computed from it counts as a device value on a CPU run (it would be on the device)."""
        audit = self._audit
        auditor = audit.auditor if audit is not None and audit.auditing else None
        if auditor is not None:
            try:
                auditor.mark_batch(batch)
            except Exception as exc:  # the audit never stops training
                log.debug("profcallbacks: cannot follow the batch in the sync audit (%s).", exc)

    def batch_done(self) -> None:
        """A micro-batch of the current step is done; waiting for the next one starts now."""
        self._wait_from = self._clock()

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
        for participant in self._hooks["pause"]:
            try:
                participant.pause()
            except Exception as exc:
                self._disable(participant, self.step, exc)

    def resume(self) -> None:
        """The work between steps is over: the next step starts timing now."""
        if self._paused:
            self._paused = False
            if self._device_timer is not None:
                self._device_timer.break_chain()
            self._captures.end_between_steps()
            if self._opened:
                self._begin_block(self._clock(), after_pause=True)

    @property
    def tracing(self) -> bool:
        """A capture window is recording this step (front ends mark their fetches in it)."""
        capture = self._captures.active
        return capture is not None and capture.recording

    def step_end(self) -> None:
        """The current optimizer step is complete.

        The hot path: a clock read, a store into the block buffer and one comparison. Everything
        else (participants, summaries) runs in ``_block_boundary`` once per block. On CUDA the
        clock read also records the step's CUDA event (``_device_step_clock``).
        """
        now = self._step_clock()
        n = self._n + 1
        self._n = n
        self._ends[n] = now
        if n >= self._due:
            self._block_boundary(now)

    def _device_step_clock(self) -> float:
        """The clock, after recording the step's CUDA event (read lazily, never synchronised)."""
        timer = self._device_timer
        if timer is not None:  # None: it failed earlier and is off, warned once
            try:
                timer.mark()
            except Exception as exc:
                log.warning("profcallbacks: CUDA step timing failed (%s); it is off.", exc)
                self._device_timer = None
                self._step_clock = self._clock
        return self._clock()

    def on_exception(self, error: BaseException) -> None:
        """A step raised ``error``: an ``out_of_memory`` finding if it is one (before ``close``)."""
        if not self._opened:
            return
        for participant in list(self._participants):
            try:
                for finding in participant.on_exception(self.step, error):
                    self.emit(finding)
            except Exception as exc:
                self._disable(participant, self.step, exc)

    def close(self, *, failed: bool = False) -> None:
        """Stop any capture (exported as partial), flush summaries and finish exports."""
        if not self._opened:
            return
        if not self._paused:
            self._end_block(self._clock())
        self._opened = False
        self._due = 0
        try:
            for participant in reversed(self._participants):
                participant.close(failed=failed)
            if self._audit is not None and self.step > self._start_step:
                self._audit.finish(self.step - 1)  # a round cut short, or a check that did not run
            self._emit_taken_findings()
            summary = self._times.flush()
            if summary is not None and self._publisher is not None:
                self._publish(summary, self._clock())
        finally:
            if self._compile is not None:
                self._compile.uninstall()
            if self._publisher is not None:
                self._publisher.close()
            if self._tensorboard is not None:
                self._tensorboard.close()
            if self._findings_file is not None:
                self._findings_file.close()
            self._release_lock()
            reruns.release(self.logdir, self)

    def __del__(self) -> None:
        """Collected while open (abandoned by an exception): close, with one warning."""
        if getattr(self, "_opened", False) and not sys.is_finalizing():
            log.warning("profcallbacks: a profiler on %s was never closed and is collected; it "
                        "is closed now.", self.logdir)
            try:
                self.close(failed=True)
            except Exception:  # never raise from the collector
                pass

    def _leave_shared_files(self, lock: RunLock) -> None:
        """Another run took the log directory over (this one was suspended): write this run's
        steps and findings to names of its own from now on (the lock warned once)."""
        self._left_shared = True
        run = f"{lock.host}-{os.getpid()}"
        if self._publisher is not None and self._publisher.steps_file is not None:
            steps = self._publisher.steps_file
            steps.move_to(run_specific_file(steps.path, run))
        if self._findings_file is not None:
            self._findings_file.move_to(run_specific_file(self._findings_file.path, run))

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

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

    def _from_another_thread(self) -> bool:
        """Whether this block boundary is reached on a thread other than the one stepping the
        session (the first to reach one, while it lives): that thread's boundary work (the
        profiler's windows, kineto's export) is left to it, so it never runs on two threads at
        once. The block stays due; this step is not counted once the block buffer is full.
        Warns once."""
        current = threading.current_thread()
        owner = self._stepper
        if owner is None or owner is current or not owner.is_alive():
            self._stepper = current
            return False
        if not self._warned_threads:
            self._warned_threads = True
            log.warning("profcallbacks: step() is called from thread %r while thread %r steps "
                        "this profiler; its capture windows and summaries stay on %r (steps of "
                        "other threads are counted between its steps). Call step() from one "
                        "thread, the one that runs the optimizer step.", current.name,
                        owner.name, owner.name)
        if self._n >= BLOCK_STEPS:
            self._n -= 1  # the buffer is full until the stepping thread comes back
        return True

    def _end_block(self, now: float) -> None:
        """Hand the buffered steps to the summaries and the participants, in step order."""
        n = self._n
        if n == 0:
            return
        ends, first, excluded = self._ends, self._first, self._block_excluded
        ended: list[Finding] = []
        for participant in self._hooks["end_block"]:
            try:
                ended += participant.end_block(first)
            except Exception as exc:  # a participant never stops training
                self._disable(participant, first, exc)
        after_pause = self._block_after_pause
        times = list(map(sub, ends[1:n + 1], ends[:n]))  # one list per block, no object per step
        waits = self._waits[1:n + 1]
        self._first = first + n
        self._n = 0
        self._block_len = _next_block_len(times, self._block_s)
        if self._compile is None and "torch._dynamo" in sys.modules:
            self._watch_compile()  # torch.compile was first called after open()
        watch = self._compile
        compiled = watch.take_times(first + n) if watch is not None else None
        participants = self._hooks["observe_block"]
        if not compiled:  # the common case: one hand-over of the whole block
            found = self._hand_over(participants, first, times, waits, excluded, after_pause,
                                    ends, now)
        else:  # steps that compiled are handed over alone, as excluded steps
            found = []
            for a, b, part_excluded, compile_s in compile_segments(first, n, excluded, compiled):
                found += self._hand_over(participants, first + a, times[a:b], waits[a:b],
                                         part_excluded, after_pause and a == 0, ends[a:], now,
                                         compile_s)
        if watch is not None and (watch.pending or watch.poll):
            found += watch.drain()
        if found:
            found.sort(key=_finding_step)  # stable: per step in participant order, as step by step
            for finding in found:
                self._on_finding(finding)
        for finding in ended:
            self._on_finding(finding)
        self._emit_taken_findings()

    def _hand_over(self, participants: list[Participant], first: int, times: list[float],
                   waits: list[float], excluded: bool, after_pause: bool, ends: list[float],
                   now: float, compile_s: float = 0.0) -> list[Finding]:
        """Consecutive steps from ``first`` to the summaries and the participants; their findings.

        ``ends[k]`` is when the ``k``-th of them ended (``ends[0]``: when the first began).
        """
        n = len(times)
        publisher = self._publisher
        for summary in self._times.add_block(first, times, waits, excluded, compile_s):
            if publisher is not None:  # at the clock time its last step ended
                k = summary.last_step - first + 1
                self._publish(summary, ends[k] if 0 < k <= n else now)
        found: list[Finding] = []
        for participant in participants:
            if participant not in self._participants:
                continue  # disabled by an earlier part of this block
            try:
                found += participant.observe_block(first, times, waits, excluded, after_pause)
            except Exception as exc:  # a participant never stops training
                self._disable(participant, first, exc)
        return found

    def _begin_block(self, now: float, *, after_pause: bool) -> None:
        """Start a block at step ``self.step``; our own bookkeeping belongs to no step."""
        step = self._first
        for participant in self._hooks["begin_block"]:
            try:
                for finding in participant.begin_block(step, now):
                    self.emit(finding)
            except Exception as exc:  # a participant never stops training
                self._disable(participant, step, exc)
        hooks, excluded, boundary = self._hooks, False, NEVER
        for participant in hooks["disturbs_steps"]:  # loops, not generators: once per block
            if participant.disturbs_steps:
                excluded = True
                break
        for participant in hooks["boundary_step"]:
            boundary = min(boundary, participant.boundary_step(step))
        self._block_excluded = excluded
        self._block_after_pause = after_pause
        self._due = max(1, min(self._block_len, boundary - step))
        self._waits[1:] = _NO_WAITS  # waits added while paused belong to no step
        self._ends[0] = self._wait_from = self._clock()

    def _emit_taken_findings(self) -> None:
        """Findings made elsewhere (the export helper's, about published captures), emitted on
        this thread."""
        for participant in self._hooks["take_findings"]:
            for finding in participant.take_findings():
                self._on_finding(finding)

    def _disable(self, participant: Participant, step: int, exc: Exception) -> None:
        log.warning("profcallbacks: %s failed at step %d (%s: %s); it is disabled for the rest of "
                    "the run.", participant.name, step, type(exc).__name__, exc)
        if participant in self._participants:
            self._participants.remove(participant)
            self._participants_changed()

    def _on_finding(self, finding: Finding) -> None:
        if self._compile is not None:  # a slowdown that coincides with recompiles says so
            finding = self._compile.explain(finding)
        self.emit(finding)
        if finding.capture is not None:  # the participant asks for a capture with this finding
            self._request(finding.capture)

    def _publish(self, summary: IntervalSummary, now: float) -> None:
        """Hand ``summary`` to the sinks with a memory sample (if due), then its findings."""
        if self._lock is not None and self._lock.lost and not self._left_shared:
            self._leave_shared_files(self._lock)
        memory: dict[str, float] = {}
        findings: list[Finding] = []
        for participant in self._hooks["summary_sample"]:
            try:
                values, found = participant.summary_sample(summary.last_step, now)
            except Exception as exc:
                self._disable(participant, summary.last_step, exc)
                continue
            memory.update(values)
            findings += found
        assert self._publisher is not None
        self._publisher.publish(summary, self._extra_scalars(), memory)
        for finding in findings:
            self._on_finding(finding)

    def _extra_scalars(self) -> dict[str, float]:
        """Device step time (CUDA) and the participants' ``scalars()``."""
        values: dict[str, float] = {}
        for participant in self._hooks["scalars"]:
            try:
                values.update(participant.scalars())
            except Exception as exc:  # warned once: it is off for the rest of the run
                self._disable(participant, self.step, exc)
        if self._device_timer is not None:
            try:
                values.update(self._device_timer.scalars())
            except Exception as exc:
                log.warning("profcallbacks: CUDA step timing failed (%s); it is off.", exc)
                self._device_timer = None
                self._step_clock = self._clock
        return values


def _weak_step_now(session: ProfilingSession) -> Callable[[], int | None]:
    """``session._step_now`` without keeping the session alive (torch's compile callbacks are
    global: a session abandoned open must still be collected and close itself)."""
    ref = weakref.WeakMethod(session._step_now)

    def step_now() -> int | None:
        method = ref()
        return method() if method is not None else None

    return step_now


PATH_MARGIN = 256
"""Bytes the deepest file written under the log directory adds to its path (a staged raw trace:
staging, a private directory named after the capture and the worker, kineto's temporary name)."""


def _path_max(logdir: Path) -> int:
    probe = logdir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return int(os.pathconf(probe, "PC_PATH_MAX"))
    except (OSError, ValueError):
        return 4096


def _prepare_logdir(logdir: Path) -> Path:
    """Create ``logdir/profcallbacks``; a clear error now instead of a failure mid-training."""
    if logdir.exists() and not logdir.is_dir():
        raise NotADirectoryError(f"logdir={str(logdir)!r} is a file; pass a directory path "
                                 "(it is created if missing).")
    longest = len(os.fsencode(os.path.abspath(logdir))) + PATH_MARGIN
    if longest > _path_max(logdir):
        raise ValueError(f"logdir={str(logdir)!r} is too long: the files profcallbacks writes "
                         f"under it need paths of up to {longest} bytes, beyond the system's "
                         f"{_path_max(logdir)}; pass a shorter log directory.")
    meta = logdir / META_DIR
    try:
        logdir.mkdir(parents=True, exist_ok=True)
        ensure_dir(meta)  # a real directory: never a link planted in a shared logdir
        for where in (logdir, meta):  # captures and TensorBoard write to the root, the files to meta
            probe = where / fresh_name(".write-test-")  # a name nobody could plant in advance
            write_new(probe, b"ok")
            probe.unlink()
    except UnsafeEntryError as exc:
        raise PermissionError(f"logdir={str(logdir)!r} cannot be used: {exc.strerror}. Remove "
                              f"{str(meta)!r} or pass a log directory of your own.") from exc
    except OSError as exc:
        raise PermissionError(f"logdir={str(logdir)!r} is not writable ({exc.strerror}); pass a "
                              "directory this process can write to.") from exc
    warn_if_shared(logdir)
    return meta


def compile_segments(first: int, n: int, excluded: bool,
                     compiled: dict[int, float]) -> list[tuple[int, int, bool, float]]:
    """The block's steps ``0..n-1`` as parts ``(start, end, excluded, compile_s)``: each step
    that compiled alone and excluded, the others as they were. Compile time of
    steps before the block (``-1``: between steps) goes with its first part.

    Example:
        >>> compile_segments(10, 5, False, {12: 1.5})
        [(0, 2, False, 0.0), (2, 3, True, 1.5), (3, 5, False, 0.0)]
    """
    parts: list[tuple[int, int, bool, float]] = []
    start, early = 0, sum(s for step, s in compiled.items() if step < first)
    for step in sorted(s for s in compiled if first <= s < first + n):
        k = step - first
        if k > start:
            parts.append((start, k, excluded, 0.0))
        parts.append((k, k + 1, True, compiled[step]))
        start = k + 1
    if start < n:
        parts.append((start, n, excluded, 0.0))
    if early:
        a, b, part_excluded, seconds = parts[0]
        parts[0] = (a, b, part_excluded, seconds + early)
    return parts


def _next_block_len(times: list[float], limit_s: float = BLOCK_S) -> int:
    """Steps in the next block: :data:`BLOCK_STEPS`, fewer when that would take over ``limit_s``
    at the pace of ``times`` (the last block's), its slowest step left out: one long step (a
    checkpoint, a log line) says nothing about the steps to come.

    Example:
        >>> _next_block_len([0.001] * 10), _next_block_len([0.01] * 10), _next_block_len([0.5])
        (128, 25, 1)
        >>> _next_block_len([0.001] * 9 + [0.2])  # one long step: the pace is still 1 ms
        128
    """
    n = len(times)
    seconds = sum(times) - max(times) if n > 1 else sum(times)
    steps = n - 1 if n > 1 else n
    if seconds <= 0:
        return BLOCK_STEPS
    return max(1, min(BLOCK_STEPS, int(limit_s * steps / seconds)))
