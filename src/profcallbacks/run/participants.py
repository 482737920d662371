"""The session's own participants: capture windows, the baseline capture, memory work, the audit.

Each is a :class:`~profcallbacks.detect.base.Participant` around the part it drives; the session
runs them, and the detectors after them, in :func:`ProfilingSession`'s declared order.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from profcallbacks.capture.controller import CaptureController
from profcallbacks.capture.trace_capture import wall_ns
from profcallbacks.core.triggers import BASELINE, CaptureRequest
from profcallbacks.detect.base import NEVER, Participant, StepAuditor
from profcallbacks.findings import Finding
from profcallbacks.run.memory_monitor import MemoryMonitor

log = logging.getLogger(__name__)

MAX_AUDIT_STARTS = 10  # an audit cut short by pauses this often is given up


class BaselineRule(Participant):
    """Asks once, at ``step``, for a capture of healthy steps when no capture was taken yet."""

    def __init__(self, captures: CaptureController, step: int) -> None:
        self._captures = captures
        self._step: int | None = step

    def begin_block(self, step: int, now: float) -> Iterable[Finding]:
        if self._step is not None and step >= self._step:
            self._step = None  # once: a capture of healthy steps, before any slowdown
            if self._captures.captures_started == 0 and self._captures.active is None:
                self._captures.request(CaptureRequest(BASELINE))
        return ()

    def boundary_step(self, step: int) -> int:
        return NEVER if self._step is None else max(self._step, step + 1)


class CaptureWindows(Participant):
    """The capture controller at block boundaries: windows open and close between blocks, and
    inside a recording window each one-step block is one ``ProfilerStep#N`` span."""

    def __init__(self, captures: CaptureController) -> None:
        self.captures = captures
        self._start_ns = 0  # wall clock at the block's start, inside capture windows

    def begin_block(self, step: int, now: float) -> Iterable[Finding]:
        self.captures.begin_step(step, now)
        self._start_ns = wall_ns() if self.captures.active is not None else 0
        return ()

    @property
    def disturbs_steps(self) -> bool:
        return self.captures.affects_steps

    def boundary_step(self, step: int) -> int:
        return self.captures.boundary_step(step)

    def end_block(self, first: int) -> Iterable[Finding]:
        capture = self.captures.active
        if capture is not None and capture.recording:  # blocks are one step long in windows
            capture.add_span(first, self._start_ns, wall_ns())
        return ()

    def take_findings(self) -> Iterable[Finding]:
        return self.captures.take_findings()

    def pause(self) -> None:
        self.captures.release_retired()  # between steps: free the last capture's events

    def close(self, *, failed: bool) -> None:
        self.captures.close(failed=failed)


class MemoryWork(Participant):
    """Memory numbers with each summary, the spy of a memory capture, ``out_of_memory``."""

    def __init__(self, monitor: MemoryMonitor, captures: CaptureController) -> None:
        self.monitor: MemoryMonitor | None = monitor
        self._captures = captures

    def begin_block(self, step: int, now: float) -> Iterable[Finding]:
        monitor, active = self.monitor, self._captures.active
        if monitor is not None and (active is not None or monitor.busy):
            return monitor.window_step(step, active)  # before the audit's spy starts:
        return ()  # dispatch modes leave in the order they came

    def boundary_step(self, step: int) -> int:
        monitor = self.monitor
        return step + 1 if monitor is not None and monitor.busy else NEVER  # one by one

    def summary_sample(self, step: int, now: float) -> tuple[dict[str, float], list[Finding]]:
        if self.monitor is None:
            return {}, []
        try:
            return self.monitor.sample(step, now)
        except Exception as exc:  # memory numbers never stop training
            log.warning("profcallbacks: reading memory failed (%s); memory numbers are off.", exc)
            self.monitor = None
            return {}, []

    def on_exception(self, step: int, error: BaseException) -> Iterable[Finding]:
        finding = self.monitor.out_of_memory(step, error) if self.monitor is not None else None
        return [finding] if finding is not None else []

    def close(self, *, failed: bool) -> None:
        if self.monitor is not None:
            self.monitor.close()


class StepAudit(Participant):
    """A :class:`StepAuditor` over whole steps outside capture windows; given up after
    ``MAX_AUDIT_STARTS`` starts cut short by pauses, or at its first failure."""

    def __init__(self, auditor: StepAuditor, captures: CaptureController) -> None:
        self.auditor: StepAuditor | None = auditor
        self.auditing = False
        self._captures = captures
        self._starts = 0
        self._said: list[Finding] = []  # what the audit says of itself, taken after blocks

    def begin_block(self, step: int, now: float) -> Iterable[Finding]:
        auditor = self.auditor
        if (auditor is None or self.auditing or auditor.next_step is None
                or step < auditor.next_step or self._captures.window_open):
            return ()
        self._starts += 1
        if self._starts > MAX_AUDIT_STARTS:
            log.info("profcallbacks: the sync audit was cut short by pauses %d times; given up.",
                     MAX_AUDIT_STARTS)
            return self._give_up(step, f"cut short by pauses {MAX_AUDIT_STARTS} times at step "
                                 f"{step}, given up")
        try:
            auditor.begin_step(step)
            self.auditing = True
        except Exception as exc:
            log.warning("profcallbacks: the sync audit failed to start (%s); it is disabled.", exc)
            return self._give_up(step, f"failed to start at step {step} ({type(exc).__name__})")
        return ()

    def _give_up(self, step: int, why: str) -> list[Finding]:
        """The audit is off for the rest of the run: a ``sync_audit`` finding says why."""
        auditor, self.auditor = self.auditor, None
        if auditor is None:
            return []
        try:
            finding = auditor.stopped(step, why)
            return [finding] if finding is not None else []
        except Exception as exc:
            log.warning("profcallbacks: the sync audit could not report (%s).", exc)
            return []

    def finish(self, last_step: int) -> None:
        """The run ended after ``last_step``: a round cut short, or a check that did not run."""
        auditor, self.auditor = self.auditor, None
        if auditor is None:
            return
        try:
            self._said += auditor.finish(last_step)
        except Exception as exc:
            log.warning("profcallbacks: the sync audit could not report (%s).", exc)

    def mark_batch(self, batch: object) -> None:
        """``batch`` is the current step's input: while a step is watched, what is computed from
        it counts as a device value on a CPU run (it would be on the device). Never raises."""
        if self.auditing and self.auditor is not None:
            try:
                self.auditor.mark_batch(batch)
            except Exception as exc:  # the audit never stops training
                log.debug("profcallbacks: cannot follow the batch in the sync audit (%s).", exc)

    def take_findings(self) -> Iterable[Finding]:
        said, self._said = self._said, []
        return said

    @property
    def disturbs_steps(self) -> bool:
        return self.auditing

    def boundary_step(self, step: int) -> int:
        if self.auditing:
            return step + 1  # steps watched one by one
        auditor = self.auditor
        if auditor is not None and auditor.next_step is not None:
            return max(auditor.next_step, step + 1)
        return NEVER

    def end_block(self, first: int) -> Iterable[Finding]:
        return self._stop(first, cancel=False) if self.auditing else ()

    def pause(self) -> None:
        if self.auditing:
            self._stop(0, cancel=True)

    def close(self, *, failed: bool) -> None:
        if self.auditing:
            self._stop(0, cancel=True)

    def _stop(self, step: int, *, cancel: bool) -> list[Finding]:
        """End the audit of this step; its findings once the last audited step is done."""
        self.auditing = False
        auditor = self.auditor
        try:
            if auditor is None:
                return []
            if cancel:
                auditor.cancel()
                return []
            self._starts -= 1  # audited to its end: only starts cut short count to give up
            findings = list(auditor.end_step(step))  # blocks are one step long
            if auditor.next_step is None:
                self.auditor = None
            return findings
        except Exception as exc:
            log.warning("profcallbacks: the sync audit failed (%s); it is disabled.", exc)
            return self._give_up(step, f"failed at step {step} ({type(exc).__name__})")
