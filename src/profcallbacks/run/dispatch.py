"""The session's participants, called hook by hook: each hook only on the participants that
define it, in their order, and a participant that raises is disabled for the rest of the run
with one warning (it never stops training).

Example:
    >>> class Broken(Participant):
    ...     def end_block(self, first): raise RuntimeError("boom")
    >>> table = Participants([Broken()])
    >>> table.end_block(5), table.members
    ([], [])
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from profcallbacks.detect.base import NEVER, Participant, defining
from profcallbacks.detect.loaders import LoaderInfo
from profcallbacks.findings import Finding

log = logging.getLogger(__name__)

BLOCK_HOOKS = ("begin_block", "disturbs_steps", "boundary_step", "end_block", "observe_block",
               "take_findings", "summary_sample", "scalars", "pause")
"""The hooks called between blocks and at pauses: each only on the participants that define it."""


class Participants:
    """The participants of one session, in the order every hook runs (``close`` in reverse)."""

    def __init__(self, members: list[Participant]) -> None:
        self.members = list(members)
        self._hooks: dict[str, list[Participant]] = {}
        self._changed()

    def add(self, participant: Participant) -> None:
        """Call ``participant``'s hooks from now on, after the others'."""
        self.members.append(participant)
        self._changed()

    def _changed(self) -> None:
        self._hooks = {hook: defining(self.members, hook) for hook in BLOCK_HOOKS}

    def call(self, participant: Participant, hook: str, step: int, *args: Any) -> Any:
        """``participant.<hook>(*args)`` (a generator's findings as a list); ``None`` when it
        raised at ``step``: then it is disabled, with one warning."""
        try:
            result = getattr(participant, hook)(*args)
            return list(result) if isinstance(result, Iterator) else result
        except Exception as exc:  # a participant never stops training
            log.warning("profcallbacks: %s failed at step %d (%s: %s); it is disabled for the "
                        "rest of the run.", participant.name, step, type(exc).__name__, exc)
            if participant in self.members:
                self.members.remove(participant)
                self._changed()
            return None

    def begin_block(self, step: int, now: float) -> tuple[list[Finding], bool, int]:
        """A block begins at ``step``: the findings of ``begin_block``, whether the block's steps
        are disturbed (excluded), and the step before which it must end (:data:`NEVER`)."""
        found: list[Finding] = []
        for participant in self._hooks["begin_block"]:
            found += self.call(participant, "begin_block", step, step, now) or ()
        hooks, excluded, boundary = self._hooks, False, NEVER
        for participant in hooks["disturbs_steps"]:  # loops, not generators: once per block
            if participant.disturbs_steps:
                excluded = True
                break
        for participant in hooks["boundary_step"]:
            boundary = min(boundary, participant.boundary_step(step))
        return found, excluded, boundary

    def end_block(self, first: int) -> list[Finding]:
        """The last step of the block that began at ``first`` just ended."""
        found: list[Finding] = []
        for participant in self._hooks["end_block"]:
            found += self.call(participant, "end_block", first, first) or ()
        return found

    def observe_block(self, first: int, times: list[float], waits: list[float], excluded: bool,
                      after_pause: bool) -> list[Finding]:
        """The steps from ``first`` to every participant that observes them; their findings."""
        found: list[Finding] = []
        for participant in self._hooks["observe_block"]:
            if participant in self.members:  # not disabled by an earlier part of the block
                found += self.call(participant, "observe_block", first, first, times, waits,
                                   excluded, after_pause) or ()
        return found

    def take_findings(self) -> list[Finding]:
        """Findings made elsewhere (e.g. by the export helper) since the last call."""
        return [f for participant in self._hooks["take_findings"]
                for f in participant.take_findings()]

    def summary_sample(self, step: int, now: float) -> tuple[dict[str, float], list[Finding]]:
        """The values read with a summary ending at ``step`` (memory), and findings."""
        values: dict[str, float] = {}
        found: list[Finding] = []
        for participant in self._hooks["summary_sample"]:
            sample = self.call(participant, "summary_sample", step, step, now)
            if sample is not None:
                values.update(sample[0])
                found += sample[1]
        return values, found

    def scalars(self, step: int) -> dict[str, float]:
        """The participants' extra values for a summary (e.g. ``slowdown_ratio``)."""
        values: dict[str, float] = {}
        for participant in self._hooks["scalars"]:
            values.update(self.call(participant, "scalars", step) or {})
        return values

    def pause(self, step: int) -> None:
        """Work between steps begins."""
        for participant in self._hooks["pause"]:
            self.call(participant, "pause", step)

    def set_loader(self, info: LoaderInfo, step: int) -> None:
        """The loader that feeds the steps."""
        for participant in list(self.members):
            self.call(participant, "set_loader", step, info)

    def on_exception(self, step: int, error: BaseException) -> list[Finding]:
        """A step raised ``error``: the findings it makes (e.g. ``out_of_memory``)."""
        found: list[Finding] = []
        for participant in list(self.members):
            found += self.call(participant, "on_exception", step, step, error) or ()
        return found

    def close(self, *, failed: bool) -> None:
        """The run is over: every participant closes, the last first."""
        for participant in reversed(self.members):
            participant.close(failed=failed)
