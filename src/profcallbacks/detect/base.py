"""The one contract of everything the session runs at block boundaries, and the plain detector's.

A :class:`Participant` is driven by the session between steps, once per block of steps (up to
``BLOCK_STEPS`` steps or ``BLOCK_S`` seconds): detectors, the sync audit, the memory work, the
capture windows and the baseline-capture rule all are participants. Every hook is declared here
with a default that does nothing, so a participant defines only the hooks it needs; the session
calls each hook, in its declared order, on the participants that define it (:func:`defining`).

A :class:`Detector` is the smallest contract: ``observe`` each finished step. The session runs a
plain detector as a participant (:class:`RecordDetector`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from profcallbacks.core.timing import StepRecord
from profcallbacks.detect.loaders import LoaderInfo
from profcallbacks.findings import Finding

NEVER = 1 << 62
"""A step number no run reaches: no block boundary is needed."""


class Detector(Protocol):
    """Looks at each finished step and returns what it concludes (usually nothing)."""

    def observe(self, record: StepRecord) -> Iterable[Finding]: ...


class Participant:
    """Runs at block boundaries; every hook is optional (the defaults do nothing).

    Hooks, as the session calls them: ``begin_block`` when a block of steps begins (after the
    start, a pause, or the previous block); ``disturbs_steps`` and ``boundary_step`` right
    after, when every participant has begun the block; ``end_block`` the moment the block's
    last step ended (stop what watched the steps); then, after the block's step-time summaries
    (``summary_sample`` and ``scalars`` give their extra values), ``observe_block`` with the
    block's steps; ``take_findings`` after that; ``set_loader`` when the loader is known;
    ``pause`` when work between steps begins; ``on_exception`` when a step raised; ``close``
    at the end of the run, in the reverse order. Findings are emitted per block in this order:
    those of ``observe_block`` (by step; per step in participant order), of ``end_block``,
    then of ``take_findings``.

    A hook that raises disables its participant for the rest of the run, with one warning
    (participants that must do otherwise catch their own errors).
    """

    @property
    def name(self) -> str:
        """What the warnings call this participant."""
        return type(self).__name__

    def begin_block(self, step: int, now: float) -> Iterable[Finding]:
        """A block begins at ``step`` (``now``: the session's clock)."""
        return ()

    @property
    def disturbs_steps(self) -> bool:
        """This participant's work between the block's steps changes their times (a capture
        window, an audit): the block's steps are ``excluded``."""
        return False

    def boundary_step(self, step: int) -> int:
        """The block that begins at ``step`` must end before this step (:data:`NEVER`: no need).

        A participant that must run at a given step (one that meets the other ranks in a
        collective, one that watches steps one by one) returns it here.
        """
        return NEVER

    def end_block(self, first: int) -> Iterable[Finding]:
        """The last step of the block that began at ``first`` just ended."""
        return ()

    def observe_block(self, first: int, times: list[float], waits: list[float], excluded: bool,
                      after_pause: bool) -> Iterable[Finding]:
        """Take the steps ``first``, ``first + 1``, ... of one block, in order.

        A detector's findings must equal those of ``observe`` on each step of the block in
        order (the session orders the findings of all participants by step).

        Args:
            first: Number of the block's first step.
            times: Each step's time in seconds (data wait included, pauses excluded).
            waits: Each step's data wait in seconds.
            excluded: Every step of the block is excluded from the statistics (it ran captured,
                audited or compiling: see ``StepRecord.excluded``); a block is never mixed.
            after_pause: The block's first step (only it) followed a pause or the start.
        """
        return ()

    def take_findings(self) -> Iterable[Finding]:
        """Findings made elsewhere since the last call (e.g. by the export helper)."""
        return ()

    def summary_sample(self, step: int, now: float) -> tuple[dict[str, float], list[Finding]]:
        """Numbers read with a step-time summary ending at ``step`` (memory), and findings."""
        return {}, []

    def scalars(self) -> dict[str, float]:
        """Extra values logged with each step-time summary (e.g. ``slowdown_ratio``)."""
        return {}

    def set_loader(self, info: LoaderInfo) -> None:
        """The loader that feeds the steps (``detect.loaders.describe_loader``)."""

    def pause(self) -> None:
        """Work between steps begins: what watches steps one by one stops for now."""

    def on_exception(self, step: int, error: BaseException) -> Iterable[Finding]:
        """A step raised ``error`` (e.g. out of memory); before ``close``."""
        return ()

    def close(self, *, failed: bool) -> None:
        """The run is over (``failed``: it ends with an error); findings made here are handed
        over by ``take_findings`` right after (e.g. a stall too short for its hold)."""


def defining(participants: Iterable[Participant], hook: str) -> list[Participant]:
    """The ``participants`` whose class defines ``hook`` (the others would do nothing), in order.

    Example:
        >>> class Counter(Participant):
        ...     def end_block(self, first): return ()
        >>> [type(p).__name__ for p in defining([Participant(), Counter()], "end_block")]
        ['Counter']
    """
    default = getattr(Participant, hook)
    return [p for p in participants if getattr(type(p), hook) is not default]


class RecordDetector(Participant):
    """A plain :class:`Detector` as a participant: one :class:`StepRecord` per step."""

    def __init__(self, detector: Detector) -> None:
        self.detector = detector

    @property
    def name(self) -> str:
        return type(self.detector).__name__

    def observe_block(self, first: int, times: list[float], waits: list[float], excluded: bool,
                      after_pause: bool) -> Iterable[Finding]:
        found: list[Finding] = []
        observe = self.detector.observe
        for k in range(len(times)):
            found += observe(StepRecord(first + k, times[k], waits[k], excluded,
                                        after_pause and k == 0))
        return found


class StepAuditor:
    """Watches a few whole steps (e.g. the sync audit); costs nothing on the other steps.

    The session's audit participant calls ``begin_step`` at the start of a step once ``step >=
    next_step`` (outside capture windows), ``end_step`` at its end and ``cancel`` for a step
    cut short by a pause; these three every auditor defines. The optional hooks below do
    nothing unless defined: ``mark_batch`` (the step's input, while a step is watched),
    ``finish`` (the run ended) and ``stopped`` (the audit is given up).
    """

    next_step: int | None = None  # audit this step (or the first one after it outside a capture)

    def begin_step(self, step: int) -> None:
        raise NotImplementedError

    def end_step(self, step: int) -> Iterable[Finding]:
        raise NotImplementedError

    def cancel(self) -> None:
        raise NotImplementedError

    def mark_batch(self, batch: object) -> None:
        """``batch`` is the watched step's input (what is computed from it is device data)."""

    def finish(self, last_step: int) -> list[Finding]:
        """The run ended after ``last_step``: what the auditor says of the checks left."""
        return []

    def stopped(self, step: int, why: str) -> Finding | None:
        """The audit is given up at ``step`` (``why`` in a few words): a finding saying so."""
        return None
