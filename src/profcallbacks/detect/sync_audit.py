"""Host-device sync points in the user's code, found by short audits of a few steps."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from profcallbacks.detect.sync_fixes import KNOWN_FIXES, known_fix
from profcallbacks.detect.sync_spy import SyncSite, SyncSpy
from profcallbacks.findings import SYNC_POINT, Finding
from profcallbacks.options.sync_audit import SyncAuditConfig, resolve_sync_audit

if TYPE_CHECKING:
    from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["KNOWN_FIXES", "SyncAuditConfig", "SyncAuditor", "known_fix", "resolve_sync_audit"]

log = logging.getLogger(__name__)


class SyncAuditor:
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
        self._skipped = 0
        self._derived: WeakIdKeyDictionary | None = None

    def begin_step(self, step: int) -> None:
        planned = self.next_step
        if self._in_round == 0 and planned is not None and step > planned:
            aligned = _realigned(planned, self.config.steps, step)
            if aligned != step:  # a capture window was in the way: keep the round's alignment
                self.next_step = aligned
                return
        self._spy = SyncSpy(self.config.libraries, accelerator=self._accelerator,
                            derived=self._derived)
        self._spy.__enter__()
        self._derived = self._spy.derived_tensors  # values made in one audited step and read
        # in the next (Lightning converts a step's logged values after it) stay known

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
            self._seen_at.setdefault(key, []).append(step)
        self._audited.append(step)
        self._in_round += 1
        if self._in_round < self.config.steps:
            self.next_step = step + 1
            return []
        self._in_round = 0
        later = [s for s in self._rounds if s > step]
        self._rounds = later[1:]
        self.next_step = later[0] if later else None
        return self._findings(step, spy.accelerator)

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
                "on_device": site.on_device,
                "decided_by": ("the op read an accelerator tensor" if accelerator else
                               "CPU run: the tensor derives from trainable parameters, so it would "
                               "be on the accelerator (host-only tensors such as optimizer step "
                               "counters and index tensors are left out)")}
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
                message = (f"host-device sync point at {site.location}: {site.op} {when} {cost}; "
                           "keep the value on the device, or read it every N steps.")
            found.append(Finding(SYNC_POINT, step, self.rank, "warning" if warn else "info",
                                 message, details))
        log.info("profcallbacks: sync audit of steps %s found %d new call sites (%d calls on "
                 "host-only tensors left out).", _ranges(self._audited), len(found), self._skipped)
        return found


def _realigned(planned: int, steps: int, offered: int) -> int:
    """The first step of a round planned at ``planned`` moved past ``offered``, keeping its
    alignment on 100 or 10 (by its last step); unaligned rounds run at ``offered``."""
    last = planned + steps - 1
    period = 100 if last % 100 == 0 else 10 if last % 10 == 0 else 0
    if not period:
        return offered
    while planned < offered:
        planned += period
    return planned


def _ranges(steps: list[int]) -> str:
    return ", ".join(map(str, steps))


def audit_findings_of(findings: Iterable[Finding]) -> list[Finding]:
    """The ``sync_point`` findings among ``findings`` that point into the user's own code."""
    return [f for f in findings if f.kind == SYNC_POINT and not f.details.get("library")]
