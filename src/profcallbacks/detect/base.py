"""The two contracts a detector can follow; the session calls them and knows nothing else."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from profcallbacks.core.timing import StepRecord
from profcallbacks.findings import Finding


class Detector(Protocol):
    """Looks at each finished step and returns what it concludes (usually nothing).

    The session hands over the steps once per block (up to ``BLOCK_STEPS`` steps or
    ``BLOCK_S`` seconds), in step order, so findings arrive at most one block later. A detector
    that must run at a given step (e.g. one that meets the other ranks in a collective) also
    defines ``attention_step(step) -> int``: the block ends before that step.
    """

    def observe(self, record: StepRecord) -> Iterable[Finding]: ...


class BlockDetector(Detector, Protocol):
    """A detector that also takes a whole block at once, from the session's flat buffers.

    The session calls ``observe_block`` instead of ``observe`` when a detector has it (the
    built-in ones do): no :class:`StepRecord` is made per step and the detector's per-step work
    runs in one loop over plain lists. The findings must equal those of ``observe`` called on
    each step of the block in order (the session orders the findings of all detectors by step).
    """

    def observe_block(self, first: int, times: list[float], waits: list[float], captured: bool,
                      after_pause: bool) -> Iterable[Finding]:
        """Take the steps ``first``, ``first + 1``, ... of one block.

        Args:
            first: Number of the block's first step.
            times: Each step's time in seconds (data wait included, pauses excluded).
            waits: Each step's data wait in seconds.
            captured: Every step of the block ran captured or audited (a block is never mixed).
            after_pause: The block's first step (only it) followed a pause or the start.
        """
        ...


class StepAuditor(Protocol):
    """Watches a few whole steps (e.g. the sync audit); costs nothing on the other steps."""

    next_step: int | None  # audit this step (or the first one after it outside a capture)

    def begin_step(self, step: int) -> None: ...

    def end_step(self, step: int) -> Iterable[Finding]: ...

    def cancel(self) -> None: ...
