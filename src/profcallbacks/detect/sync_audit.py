"""Host-device sync points in the user's code, found by short audits of a few steps."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from profcallbacks.detect.base import StepAuditor
from profcallbacks.detect.sync_fixes import known_fix, op_fix
from profcallbacks.detect.sync_spy import SyncSite, SyncSpy
from profcallbacks.findings import SYNC_AUDIT, SYNC_POINT, Finding
from profcallbacks.options.sync_audit import SyncAuditConfig

if TYPE_CHECKING:
    from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["SyncAuditor"]

log = logging.getLogger(__name__)


class SyncAuditor(StepAuditor):
    """Runs a :class:`SyncSpy` over a few rounds of whole steps and turns what it saw into findings.

    The session calls ``begin_step(step)`` at the start of a step once ``step >= next_step`` (and
    no capture window is open) and ``end_step(step)`` at its end; ``cancel()`` drops a step cut
    short by a pause. Each round's new call sites are findings at its last step. After the last
    round ``next_step`` is ``None`` and nothing runs again.

    Example:
        >>> auditor = SyncAuditor(SyncAuditConfig(at_step=0, steps=1))
        >>> auditor.begin_step(0); _ = torch.ones(2).sum().item()     # doctest: +SKIP
        >>> [f.details["op"] for f in auditor.end_step(0)]            # doctest: +SKIP
        ['item']
    """

    def __init__(self, config: SyncAuditConfig, rank: int = 0, accelerator: bool | None = None) -> None:
        self.config = config
        self.rank = rank
        self._rounds = sorted({config.at_step, *config.repeat_at})
        self.next_step: int | None = self._rounds.pop(0)
        self._accelerator = accelerator
        self._spy: SyncSpy | None = None
        self._in_round = 0                       # steps of the current round audited so far
        self._sites: dict[tuple[str, str, str | None], SyncSite] = {}
        self._seen_at: dict[tuple[str, str, str | None], list[int]] = {}
        self._reported: set[tuple[str, str, str | None]] = set()
        self._audited: list[int] = []
        self._round: list[int] = []              # steps of the current round audited so far
        self._round_plan = self._planned(self.next_step)
        self._accelerator_seen = False
        self._skipped = 0
        self._derived: WeakIdKeyDictionary | None = None

    def begin_step(self, step: int) -> None:
        planned = self.next_step
        if self._in_round == 0 and planned is not None and step > planned:
            aligned = _realigned(planned, self.config.steps, step)
            if aligned != step:  # a capture window was in the way: keep the round's alignment
                self.next_step = aligned
                self._round_plan = self._planned(aligned)
                return
        self._spy = SyncSpy(self.config.libraries, accelerator=self._accelerator,
                            derived=self._derived)
        self._spy.__enter__()
        self._derived = self._spy.derived_tensors  # values made in one audited step and read
        # in the next (Lightning converts a step's logged values after it) stay known

    def mark_batch(self, batch: Any) -> None:
        """``batch`` is the audited step's input (see :meth:`SyncSpy.mark`)."""
        if self._spy is not None:
            self._spy.mark(batch)

    def cancel(self) -> None:
        """Stop the spy and forget the current step (it will be audited again later)."""
        spy, self._spy = self._spy, None
        if spy is not None:
            spy.__exit__(None, None, None)

    def end_step(self, step: int) -> list[Finding]:
        spy, self._spy = self._spy, None
        if spy is None:
            return []
        spy.__exit__(None, None, None)
        self._skipped += spy.skipped
        for key, site in spy.sites.items():
            mine = self._sites.setdefault(key, SyncSite(site.location, site.op, site.library))
            mine.calls += site.calls
            mine.blocking_s += site.blocking_s
            mine.on_device = mine.on_device or site.on_device
            for op in site.op.split(", "):
                if op not in mine.op.split(", "):
                    mine.op = f"{mine.op}, {op}" if mine.op else op
            for where, n in site.library_sites.items():
                mine.library_sites[where] = mine.library_sites.get(where, 0) + n
            mine.library_ops.update(site.library_ops)
            mine.chain = mine.chain or site.chain
            mine.implicit = mine.implicit or site.implicit
            self._seen_at.setdefault(key, []).append(step)
        self._audited.append(step)
        self._round.append(step)
        self._accelerator_seen = spy.accelerator
        self._in_round += 1
        if self._in_round < self.config.steps:
            self.next_step = step + 1
            return []
        self._in_round = 0
        later = [s for s in self._rounds if s > step]
        self._rounds = later[1:]
        self.next_step = later[0] if later else None
        found = self._findings(step, spy.accelerator)
        status = self._status(step, len(found), None)
        self._round_plan = self._planned(self.next_step)
        return [*found, status]

    def finish(self, last_step: int) -> list[Finding]:
        """The run ended after ``last_step``: what a round cut short found, and a ``sync_audit``
        finding for each check that did not (fully) run, saying why."""
        ended = (f"the run ended at step {last_step}" if last_step >= 0
                 else "the run ended before its first step")
        found: list[Finding] = []
        if self._round:  # a round cut short: report what its audited steps saw
            later = [p for s in self._rounds for p in self._planned(s)]
            self.next_step, self._rounds = None, []
            found = self._findings(last_step, self._accelerator_seen)
            why = f"{ended}, during the audit" + (
                f"; {_steps(later, ' not audited')}" if later else "")
            found.append(self._status(last_step, len(found), why))
        elif self.next_step is not None:
            when = "before the first audit" if not self._audited else "before the next audit"
            found.append(self.stopped(last_step, f"{ended}, {when}"))
            self.next_step, self._rounds = None, []
        return found

    def stopped(self, step: int, why: str) -> Finding:
        """The ``sync_audit`` finding of a check that did not run: ``why`` in a few words."""
        later = [p for s in self._rounds for p in self._planned(s)]
        message = f"sync audit: {why}"
        if self._round_plan:
            message += f" ({_steps(self._round_plan, ' to be audited')})"
        if later:
            message += f"; {_steps(later, ' not audited either')}"
        details: dict[str, Any] = {"ran": False, "reason": why, "planned_steps": self._round_plan,
                                   "later_steps": later, "audited_steps": list(self._audited)}
        return Finding(SYNC_AUDIT, step, self.rank, "info", message + ".", details)

    def _status(self, step: int, new_sites: int, cut_short: str | None) -> Finding:
        round_steps, self._round = self._round, []
        found = (f"{new_sites} new call site{'s' if new_sites != 1 else ''} (sync_point)"
                 if new_sites else "no new sync point")
        message = f"sync audit ran at {_steps(round_steps)}: {found}"
        if cut_short:
            message += f"; cut short: {cut_short} ({_steps(self._round_plan)} planned)"
        if self.next_step is not None:
            message += f"; next audit at step {self.next_step}"
        details: dict[str, Any] = {"ran": True, "audited_steps": round_steps,
                                   "planned_steps": self._round_plan, "new_sites": new_sites,
                                   "cut_short": cut_short, "next_step": self.next_step}
        return Finding(SYNC_AUDIT, step, self.rank, "info", message + ".", details)

    def _planned(self, first: int | None) -> list[int]:
        return [] if first is None else list(range(first, first + self.config.steps))

    def _findings(self, step: int, accelerator: bool) -> list[Finding]:
        audited = len(self._audited)
        found: list[Finding] = []
        new = [k for k in self._sites if k not in self._reported]
        self._reported.update(new)
        for key in sorted(new, key=lambda k: (k[2] is not None, -self._sites[k].calls)):
            site = self._sites[key]
            if self.config.allows(site.location):
                continue
            seen_at = self._seen_at[key]
            per_step = site.calls / len(seen_at)
            blocking_ms = 1e3 * site.blocking_s / len(seen_at)
            warn = accelerator and site.on_device and blocking_ms >= self.config.warn_blocking_ms
            cost = (f"blocks the host {blocking_ms:.3f} ms per step" if accelerator
                    else "would sync on an accelerator")
            when = (f"{per_step:g}x per step" if len(seen_at) == audited else
                    f"{per_step:g}x at step {', '.join(map(str, seen_at))} of audited steps "
                    f"{_ranges(self._audited)} (periodic work, e.g. logging every N steps)")
            details: dict[str, Any] = {
                "location": site.location, "op": site.op, "calls_per_step": per_step,
                "library": site.library, "audited_steps": list(self._audited),
                "seen_at_steps": list(seen_at),
                "blocking_ms_per_step": round(blocking_ms, 4) if accelerator else None,
                "on_device": site.on_device, "call_chain": list(site.chain),
                "implicit": site.implicit,
                "decided_by": ("the op read an accelerator tensor" if accelerator else
                               "CPU run: the tensor derives from trainable parameters or the "
                               "batch, so it would be on the accelerator (host-only tensors such "
                               "as optimizer step counters and index tensors are left out)")}
            if site.library:
                libs = [{"location": where, "op": site.library_ops.get(where, site.op),
                         "calls_per_step": n / len(seen_at), "fix": known_fix(where)}
                        for where, n in sorted(site.library_sites.items(), key=lambda x: -x[1])]
                details["library_sites"] = libs
                inside = "; ".join(f"{lib['op']} {lib['calls_per_step']:g}x at {lib['location']}"
                                   + (f" ({lib['fix']})" if lib["fix"] else "") for lib in libs[:3])
                message = (f"host-device sync point inside {site.library}, reached from "
                           f"{site.location}: {when} {cost}: {inside}.")
            else:
                how = f" ({site.implicit}, called implicitly)" if site.implicit else ""
                fix = op_fix(site.op)
                details["fix"] = fix
                message = (f"host-device sync point at {site.location}: {site.op}{how} {when} "
                           f"{cost}; " + (f"{fix}." if fix else
                                          "keep the value on the device, or read it every N steps."))
            if len(site.chain) > 1:
                message = message[:-1] + f"; call chain: {' -> '.join(site.chain)}."
            found.append(Finding(SYNC_POINT, step, self.rank, "warning" if warn else "info",
                                 message, details))
        log.info("profcallbacks: sync audit of steps %s found %d new call sites (%d calls on "
                 "host-only tensors left out).", _ranges(self._audited), len(found), self._skipped)
        return found


def _realigned(planned: int, steps: int, offered: int) -> int:
    """The first step of a round planned at ``planned`` moved past ``offered``, keeping its
    alignment on 100 or 10 (a step of the round that is a multiple of it); unaligned rounds run
    at ``offered``."""
    round_steps = range(planned, planned + steps)
    period = (100 if any(s % 100 == 0 for s in round_steps) else
              10 if any(s % 10 == 0 for s in round_steps) else 0)
    if not period:
        return offered
    while planned < offered:
        planned += period
    return planned


def _ranges(steps: list[int]) -> str:
    return ", ".join(map(str, steps))


def _steps(steps: list[int], were: str | None = None) -> str:
    """``step 19`` or ``steps 19, 20, 21``; with ``were``: ``step 19 was ...``, ``steps ... were ...``."""
    several = len(steps) > 1
    verb = "" if were is None else (" were" if several else " was") + were
    return f"step{'s' if several else ''} {_ranges(steps)}{verb}"


def audit_findings_of(findings: Iterable[Finding]) -> list[Finding]:
    """The ``sync_point`` findings among ``findings`` that point into the user's own code."""
    return [f for f in findings if f.kind == SYNC_POINT and not f.details.get("library")]
