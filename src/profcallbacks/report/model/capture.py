"""The typed model of one capture's trace, as the analyses read it (times in us).

One pass of the read stage (``read/capture_model.py``) fills it: CPU operators and annotations
with the names of those enclosing them, runtime calls, GPU kernels, copies and memsets with the
operators around their launch (correlation ids), Python frames, the step ranges, the FLOPs the
trace records, and the device. The rules in ``analyse/diagnoses/`` read it; so does throughput.

Example:
    >>> cap = Capture(steps=[(0.0, 1000.0, 1)], ops=[], runtime=[], kernels=[], frames={},
    ...               device=None)
    >>> cap.step_ms(), cap.in_steps(500.0)
    (1.0, True)
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import msgspec

from profcallbacks.core.trace_names import KERNEL
from profcallbacks.report.model.intervals import merge

Span = tuple[float, float]


@dataclass(frozen=True)
class Device:
    """The GPU a trace ran on: ``name`` and compute capability, from ``deviceProperties``
    (or guessed from kernel-name prefixes such as ``volta_``/``ampere_``: ``guessed``)."""

    name: str | None
    major: int
    minor: int
    guessed: bool = False
    nvidia: bool = True  # False for AMD GPUs, whose deviceProperties give a gfx major (9 for MI250)

    @property
    def capability(self) -> str:
        return f"sm{self.major}{self.minor}"


class Op(msgspec.Struct, gc=False):
    """A CPU operator or annotation (us); ``parents``: the names of the ones enclosing it.

    A struct outside the cyclic collector (it holds no cycle): millions of operators cost 56
    bytes each, not the 72 of a slotted dataclass, and no collector pass walks them."""

    ts: float
    end: float
    name: str
    tid: Any
    parents: tuple[str, ...] = ()


class Kernel(msgspec.Struct, gc=False):
    """A GPU kernel, memcpy or memset (us) and the host call that launched it."""

    ts: float
    end: float
    name: str
    cat: str
    launch_ts: float | None = None
    ops: tuple[str, ...] = ()  # the CPU operators enclosing the launch, outermost first

    @property
    def dur(self) -> float:
        return self.end - self.ts


@dataclass
class Capture:
    """One trace as the rules see it (times in us).

    ``steps`` are the ``ProfilerStep#N`` ranges (ours preferred, as in the report), or the whole
    host span as one range numbered -1. ``cold`` is set by the cold-start rule (run first): the
    intervals of one-off start-up work, left out of every later rule's step.
    """

    steps: list[tuple[float, float, int]]
    ops: list[Op]
    runtime: list[Op]
    kernels: list[Kernel]
    frames: dict[Any, list[Op]]
    device: Device | None
    flops: list[tuple[float, float]] = field(default_factory=list)  # ts, FLOPs of an operator
    flops_source: str | None = None  # "with_flops" (the trace's own counts) or "shapes"
    whole_span: bool = False
    cpu_only: bool = False  # no accelerator activity of any kind (CUDA, ROCm, MTIA ...)
    replayed: bool = False  # CUPTI range profiling replayed each kernel: host timings are its own
    cold: list[Span] = field(default_factory=list)
    sync_sites: list[str] = field(default_factory=list)
    cpu_load: dict[str, Any] | None = None  # the machine's load while it recorded (core/cpu_load.py)
    _starts: list[float] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.steps.sort()
        self._starts = [s for s, _, _ in self.steps]

    @property
    def n_steps(self) -> int:
        return max(len(self.steps), 1)

    @property
    def has_gpu(self) -> bool:
        return any(k.cat == KERNEL for k in self.kernels)

    def span_ms(self) -> float:
        """All steps together (ms)."""
        return sum(e - s for s, e, _ in self.steps) / 1e3

    def cold_ms(self) -> float:
        return sum(e - s for s, e in merge(self.cold)) / 1e3

    def step_ms(self) -> float:
        """The steady-state step (ms): the captured steps' mean with the cold part left out."""
        return max(self.span_ms() - self.cold_ms(), 0.0) / self.n_steps

    def in_steps(self, ts: float) -> bool:
        """Whether ``ts`` falls inside a step and outside the cold part."""
        i = bisect.bisect_right(self._starts, ts) - 1
        if i < 0 or ts > self.steps[i][1]:
            return False
        cold = self.cold
        return not cold or not any(s <= ts <= e for s, e in cold)

    def per_step(self, total_us: float) -> tuple[float, float]:
        """``(gain_ms, gain_share)`` of ``total_us`` spread over the captured steps."""
        gain = total_us / 1e3 / self.n_steps
        step = self.step_ms()
        return gain, (min(gain / step, 1.0) if step > 0 else 0.0)
