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


class StepAuditor(Protocol):
    """Watches a few whole steps (e.g. the sync audit); costs nothing on the other steps."""

    next_step: int | None  # audit this step (or the first one after it outside a capture)

    def begin_step(self, step: int) -> None: ...

    def end_step(self, step: int) -> Iterable[Finding]: ...

    def cancel(self) -> None: ...
