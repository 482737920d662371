"""What a diagnosis is, and what every rule reads (the capture model, ``model/capture.py``).

A *diagnosis* is one specific, fixable pattern in a capture, with what it costs: ``gain_ms`` is the
time the pattern takes in the trace per step, an upper bound on what fixing it can save (never
more), and ``gain_share`` is that time over the steady-state step (the step with any cold start
left out). Rules live in the sibling modules; ``registry`` runs them in a fixed order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from profcallbacks.report.model.capture import Capture, Device, Kernel, Op, Span

__all__ = ["MIN_GAIN_SHARE", "MIN_GPU_SHARE", "Capture", "Device", "Diagnosis", "Kernel", "Op",
           "Span", "ms", "op_path", "short"]
MIN_GAIN_SHARE = 0.03
"""Diagnoses costing less than 3% of the step are left out: steps of one run wander by more."""
MIN_GPU_SHARE = 0.10
"""...unless ``details["gpu_share"]`` (their share of the GPU's kernel time) reaches 10%."""


@dataclass(frozen=True)
class Diagnosis:
    """One fixable pattern and what it costs per step (durations in ms)."""

    kind: str
    what: str
    evidence: list[str]
    where: str | None
    gain_ms: float
    gain_share: float
    fix: list[str]
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "what": self.what, "evidence": list(self.evidence),
                "where": self.where, "gain_ms": round(self.gain_ms, 4),
                "gain_share": round(self.gain_share, 4), "fix": list(self.fix),
                "details": dict(self.details)}


def op_path(parents: tuple[str, ...]) -> str | None:
    """The outermost annotation or module and the innermost operator of ``parents``:
    ``## sparse_data_dist ## > ... > aten::copy_``."""
    if not parents:
        return None
    outer = next((p for p in parents if not p.startswith("aten::")), parents[0])
    inner = parents[-1]
    if outer == inner:
        return short(inner, 100)
    middle = " > ... > " if parents.index(outer) < len(parents) - 2 else " > "
    return short(outer, 50) + middle + short(inner, 50)


def short(name: str, width: int = 70) -> str:
    """``name`` cut to ``width`` characters."""
    return name if len(name) <= width else name[: width - 3] + "..."


def ms(us: float) -> str:
    """A duration in us as ``12.34 ms``."""
    return f"{us / 1e3:.2f} ms"
