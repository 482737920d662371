"""Host-device sync points in the user's code, found by a short audit of one or two steps."""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from profcallbacks.core.checks import check_int, check_number, fail
from profcallbacks.detect.sync_spy import LIBRARIES, SyncSite, SyncSpy
from profcallbacks.findings import SYNC_POINT, Finding

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SyncAuditConfig:
    """Which steps the sync audit watches and what it reports.

    The audit runs a dispatch-mode spy (about 1.7x slower on a tiny step) for ``steps`` steps from
    step ``at_step`` on, postponed past any capture window; nothing of it is installed otherwise.

    Args:
        at_step: First audited step (0-based). The default lands right after the default
            schedule's capture window (steps 10-13), once warm-up effects are gone.
        steps: Audited steps; calls per step are averaged over them.
        allow: Call sites never reported: ``"train.py:42"``, ``"train.py"`` (a whole file) or
            glob patterns such as ``"*/metrics/*.py:*"``.
        libraries: Packages whose frames are library code: their syncs are reported at the
            nearest user frame, marked as library sites.
        warn_blocking_ms: On an accelerator, a user site blocking at least this long per step
            (milliseconds) is a warning; shorter ones and every CPU-only site are info.

    Example:
        >>> SyncAuditConfig(at_step=100, allow=("train.py:42",)).steps
        2
    """

    at_step: int = 10
    steps: int = 2
    allow: tuple[str, ...] = ()
    libraries: tuple[str, ...] = LIBRARIES
    warn_blocking_ms: float = 0.05

    def __post_init__(self) -> None:
        owner = "SyncAuditConfig"
        check_int(owner, "at_step", self.at_step, minimum=0, example=10)
        check_int(owner, "steps", self.steps, minimum=1, maximum=100, example=2)
        for name, example in (("allow", ("train.py:42",)), ("libraries", ("torch",))):
            value = getattr(self, name)
            if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) for v in value):
                raise fail(owner, name, value, "a tuple of strings", example)
            object.__setattr__(self, name, tuple(value))
        check_number(owner, "warn_blocking_ms", self.warn_blocking_ms, minimum=0.0, example=0.05)

    def allows(self, location: str) -> bool:
        """Whether ``location`` (``"path/file.py:LINE"``) matches an ``allow`` entry."""
        path = location.rsplit(":", 1)[0]
        return any(fnmatch.fnmatch(x, p) or fnmatch.fnmatch(x, "*/" + p)
                   for p in self.allow for x in (location, path))


def resolve_sync_audit(value: bool | SyncAuditConfig | None) -> SyncAuditConfig | None:
    """``ProfilerConfig.sync_audit`` as a config: ``True`` gives the defaults, ``False`` none."""
    if value is True:
        return SyncAuditConfig()
    if value is False or value is None:
        return None
    if isinstance(value, SyncAuditConfig):
        return value
    raise TypeError(f"sync_audit={value!r}: expected True, False or SyncAuditConfig(...).")


class SyncAuditor:
    """Runs a :class:`SyncSpy` over a few whole steps and turns what it saw into findings.

    The session calls ``begin_step(step)`` at the start of a step once ``step >= next_step`` (and
    no capture window is open) and ``end_step(step)`` at its end; ``cancel()`` drops a step cut
    short by a pause. After the last audited step ``next_step`` is ``None`` and nothing runs again.

    Example:
        >>> auditor = SyncAuditor(SyncAuditConfig(at_step=0, steps=1))
        >>> auditor.begin_step(0); _ = torch.ones(2).sum().item()     # doctest: +SKIP
        >>> [f.details["op"] for f in auditor.end_step(0)]            # doctest: +SKIP
        ['item']
    """

    def __init__(self, config: SyncAuditConfig, rank: int = 0, accelerator: bool | None = None) -> None:
        self.config = config
        self.rank = rank
        self.next_step: int | None = config.at_step
        self._accelerator = accelerator
        self._spy: SyncSpy | None = None
        self._sites: dict[tuple[str, str, str | None], SyncSite] = {}
        self._audited: list[int] = []

    def begin_step(self, step: int) -> None:
        self._spy = SyncSpy(self.config.libraries, accelerator=self._accelerator)
        self._spy.__enter__()

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
        for key, site in spy.sites.items():
            mine = self._sites.setdefault(key, SyncSite(site.location, site.op, site.library))
            mine.calls += site.calls
            mine.blocking_s += site.blocking_s
            mine.on_device = mine.on_device or site.on_device
            for ops in site.op.split(", "):
                if ops not in mine.op.split(", "):
                    mine.op = f"{mine.op}, {ops}"
            for where, n in site.library_sites.items():
                mine.library_sites[where] = mine.library_sites.get(where, 0) + n
        self._audited.append(step)
        if len(self._audited) < self.config.steps:
            self.next_step = step + 1
            return []
        self.next_step = None
        return self._findings(step, spy.accelerator)

    def _findings(self, step: int, accelerator: bool) -> list[Finding]:
        steps = len(self._audited)
        found: list[Finding] = []
        sites = sorted(self._sites.values(), key=lambda s: (s.library is not None, -s.calls))
        for site in sites:
            if self.config.allows(site.location):
                continue
            per_step = site.calls / steps
            blocking_ms = 1e3 * site.blocking_s / steps
            warn = accelerator and site.on_device and blocking_ms >= self.config.warn_blocking_ms
            where = f"{site.location}" + (f" (inside {site.library})" if site.library else "")
            if accelerator:
                cost = f"blocks the host {blocking_ms:.3f} ms per step"
            else:
                cost = "would sync on an accelerator"
            advice = ("library code: call it less often if you can (e.g. log every N steps)"
                      if site.library else "keep the value on the device, or read it every N steps")
            message = (f"host-device sync point at {where}: {site.op} {per_step:g}x per step "
                       f"{cost}; {advice}.")
            details = {"location": site.location, "op": site.op, "calls_per_step": per_step,
                       "library": site.library, "audited_steps": list(self._audited),
                       "blocking_ms_per_step": round(blocking_ms, 4) if accelerator else None,
                       "on_device": site.on_device}
            if site.library_sites:
                details["library_sites"] = dict(site.library_sites)
            found.append(Finding(SYNC_POINT, step, self.rank, "warning" if warn else "info",
                                 message, details))
        log.info("profcallbacks: sync audit of steps %s found %d call sites.", self._audited,
                 len(found))
        return found


def audit_findings_of(findings: Iterable[Finding]) -> list[Finding]:
    """The ``sync_point`` findings among ``findings`` that point into the user's own code."""
    return [f for f in findings if f.kind == SYNC_POINT and not f.details.get("library")]
