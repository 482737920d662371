"""Which steps the sync audit watches and what it reports."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from profcallbacks.options.checks import MAX_INT, check_int, check_number, fail

LIBRARIES = ("torch", "lightning", "pytorch_lightning", "lightning_fabric", "lightning_utilities",
             "transformers", "accelerate", "torchmetrics", "profcallbacks")


@dataclass(frozen=True, kw_only=True)
class SyncAuditConfig:
    """Which steps the sync audit watches and what it reports.

    The audit runs a dispatch-mode spy (about 1.7x slower on a tiny step, 2x with the CPU-run
    tracking) for rounds of ``steps`` steps: from ``at_step`` on, then from each step in
    ``repeat_at``. Nothing of it is installed otherwise. The defaults audit steps 19-21 and
    99-101: work done every 10, 50 or 100 steps, counted from 0 (``step % 10 == 0``) or from 1
    (``(step + 1) % 10 == 0``, as the HF Trainer and Lightning log), is seen by the end of step
    101, for 6 audited steps in all, on both sides of the step boundary: work a loop does after
    ``prof.step()`` (a callback that runs after ours) lands in the next step, and is still seen.
    A round that a capture window is in the way of moves to the next steps with the same
    alignment (19-21 to 29-31, 99-101 to 199-201); a round not aligned on 10 runs right after
    the window. Each round ends with a ``sync_audit`` finding saying which steps it audited; a
    run that ends before an audit, or an audit given up, says why in one too.

    Args:
        at_step: First audited step (0-based).
        steps: Audited steps per round.
        repeat_at: First steps of the later rounds.
        allow: Call sites never reported: ``"train.py:42"``, ``"train.py"`` (a whole file) or
            glob patterns such as ``"*/metrics/*.py:*"``.
        libraries: Packages whose frames are library code: their syncs are reported at the
            nearest user frame, marked as library sites with the library's own lines.
        warn_blocking_ms: On an accelerator, a user site blocking at least this long per step
            (milliseconds) is a warning; shorter ones and every CPU-only site are info.

    Example:
        >>> SyncAuditConfig(at_step=9, repeat_at=(49,), allow=("train.py:42",)).audited_steps
        (9, 10, 11, 49, 50, 51)
    """

    at_step: int = 19
    steps: int = 3
    repeat_at: tuple[int, ...] = (99,)
    allow: tuple[str, ...] = ()
    libraries: tuple[str, ...] = LIBRARIES
    warn_blocking_ms: float = 0.05

    def __post_init__(self) -> None:
        owner = "SyncAuditConfig"
        check_int(owner, "at_step", self.at_step, minimum=0, example=19)
        check_int(owner, "steps", self.steps, minimum=1, maximum=100, example=3)
        for name, example in (("allow", ("train.py:42",)), ("libraries", ("torch",))):
            value = getattr(self, name)
            if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) for v in value):
                raise fail(owner, name, value, "a tuple of strings", example)
            object.__setattr__(self, name, tuple(value))
        value = self.repeat_at
        if not isinstance(value, (tuple, list)) or not all(
                isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_INT for v in value):
            raise fail(owner, "repeat_at", value, "a tuple of step numbers",
                       fix="Use e.g. repeat_at=(99,), or () for one round.")
        object.__setattr__(self, "repeat_at", tuple(value))
        check_number(owner, "warn_blocking_ms", self.warn_blocking_ms, minimum=0.0, example=0.05)

    @property
    def audited_steps(self) -> tuple[int, ...]:
        """The steps audited when no capture window is in the way (the audit budget)."""
        return tuple(sorted({s + i for s in (self.at_step, *self.repeat_at)
                             for i in range(self.steps)}))

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
