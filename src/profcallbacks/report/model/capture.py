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
import math
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain, compress, islice
from operator import le
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


class OpTable:
    """Every CPU operator and annotation of a trace as columns, in the order read (times in us).

    An operator is a row: ``ts[i]``, ``end[i]``, ``names[name[i]]``, ``tids[tid[i]]`` and
    ``chains[parent[i]]`` (the names of the operators enclosing it, outermost first). About 28
    bytes a row instead of ~150 for an ``Op`` object with its floats: a trace of 10^7 operators
    fits in a few hundred MB. Rules that want objects take them for the rows they select
    (:meth:`named`, :meth:`op`); iterating the table makes one ``Op`` per row, for the few rules
    that walk every operator of small traces.

    Example:
        >>> table = OpTable.of([Op(0.0, 5.0, "aten::mm", 1), Op(1.0, 2.0, "aten::t", 1, ("aten::mm",))])
        >>> len(table), [o.name for o in table.named(lambda n: n.endswith("t"))]
        (2, ['aten::t'])
    """

    def __init__(self) -> None:
        self.ts = array("d")
        self.end = array("d")
        self.name = array("i")  # index into names
        self.tid = array("i")  # index into tids
        self.parent = array("i")  # index into chains; filled by :meth:`unnested` until nested
        self.names: list[str] = []
        self.tids: list[Any] = []
        self.chains: list[tuple[str, ...]] = [()]
        self._name_ids: dict[str, int] = {}
        self._tid_ids: dict[Any, int] = {}

    @classmethod
    def of(cls, ops: Iterable[Op]) -> OpTable:
        """The table of ``ops`` (their ``parents`` kept)."""
        table = cls()
        chain_ids: dict[tuple[str, ...], int] = {(): 0}
        for op in ops:
            table.append(op.ts, op.end, op.name, op.tid)
            table.parent.append(0)
            chain = chain_ids.get(op.parents)
            if chain is None:
                chain = chain_ids[op.parents] = len(table.chains)
                table.chains.append(op.parents)
            table.parent[-1] = chain
        return table

    def unnested(self) -> None:
        """Gives every row the empty chain of parents, where rows were appended without."""
        self.parent = array("i", bytes(4 * len(self.ts)))

    def append(self, ts: float, end: float, name: str, tid: Any) -> None:
        """Adds a row without its parents (the ``parent`` column is filled after the last row:
        :meth:`unnested`, then the nesting)."""
        ids = self._name_ids
        n = ids.get(name)
        if n is None:
            n = ids[name] = len(self.names)
            self.names.append(name)
        try:
            t = self._tid_ids.get(tid)
            hashable = True
        except TypeError:  # a pid/tid a hostile trace made a list: a thread of its own
            t, hashable = None, False
        if t is None:
            t = len(self.tids)
            self.tids.append(tid)
            if hashable:
                self._tid_ids[tid] = t
        self.ts.append(ts)
        self.end.append(end)
        self.name.append(n)
        self.tid.append(t)

    def id_of(self, name: str) -> int | None:
        """``name``'s id in the ``name`` column, or ``None`` if no row has that name."""
        return self._name_ids.get(name)

    @property
    def tid_ids(self) -> dict[Any, int]:
        """Each thread's id in the ``tid`` column, by its key (threads a hostile trace keyed by
        a list are left out: each of their rows is a thread of its own)."""
        return self._tid_ids

    def __len__(self) -> int:
        return len(self.ts)

    def __bool__(self) -> bool:
        return len(self.ts) > 0

    def op(self, i: int) -> Op:
        """Row ``i`` as an ``Op``."""
        return Op(self.ts[i], self.end[i], self.names[self.name[i]], self.tids[self.tid[i]],
                  self.chains[self.parent[i]])

    def __iter__(self) -> Iterator[Op]:
        return map(self.op, range(len(self.ts)))

    def name_ids(self, test: Callable[[str], bool]) -> set[int]:
        """The ids of the names that pass ``test`` (each name tested once)."""
        return {i for i, name in enumerate(self.names) if test(name)}

    def rows_named(self, test: Callable[[str], bool]) -> list[int]:
        """The rows whose name passes ``test``, in table order."""
        wanted = self.name_ids(test)
        if not wanted:
            return []
        if len(wanted) == 1:
            (only,) = wanted
            return [i for i, n in enumerate(self.name) if n == only]
        return [i for i, n in enumerate(self.name) if n in wanted]

    def spans_named(self, test: Callable[[str], bool]) -> Iterator[tuple[float, float]]:
        """``(ts, end)`` of the rows whose name passes ``test``, in table order (the columns
        zipped, no row looked up one by one).

        Example:
            >>> table = OpTable.of([Op(0.0, 5.0, "a", 1), Op(1.0, 2.0, "b", 1), Op(3.0, 4.0, "a", 1)])
            >>> list(table.spans_named(lambda n: n == "a"))
            [(0.0, 5.0), (3.0, 4.0)]
        """
        wanted = [test(name) for name in self.names]
        spans = zip(self.ts, self.end, strict=True)
        if all(wanted):
            return spans
        if not any(wanted):
            return iter(())
        return compress(spans, map(wanted.__getitem__, self.name))

    def named(self, test: Callable[[str], bool]) -> list[Op]:
        """The operators whose name passes ``test``, in table order."""
        return [self.op(i) for i in self.rows_named(test)]


@dataclass
class Capture:
    """One trace as the rules see it (times in us).

    ``steps`` are the ``ProfilerStep#N`` ranges (ours preferred, as in the report), or the whole
    host span as one range numbered -1. ``cold`` is set by the cold-start rule (run first): the
    intervals of one-off start-up work, left out of every later rule's step.
    """

    steps: list[tuple[float, float, int]]
    ops: OpTable  # a list of ``Op`` is made a table
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
        if not isinstance(self.ops, OpTable):
            self.ops = OpTable.of(self.ops)
        self.steps.sort()
        self._starts = [s for s, _, _ in self.steps]

    @property
    def n_steps(self) -> int:
        return max(len(self.steps), 1)

    def load_rows(self) -> list[list[Any]]:
        """The ``cpu_load`` rows ``[wall, cpu, run delay, pressure]`` (ms) of steps with a wall
        time, whose first three figures are numbers (a hostile or old trace's others left out)."""
        rows = (self.cpu_load or {}).get("steps")
        return [r for r in rows if isinstance(r, list) and len(r) == 4 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in r[:3]) and r[0] > 0
        ] if isinstance(rows, list) else []

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

    def rows_in_steps(self) -> Iterator[int]:
        """The rows of ``ops`` that :meth:`in_steps` keeps, in table order, one at a time (a
        bisection per step, no test per row, where the table is in start order as most traces
        are read)."""
        ts = self.ops.ts
        if self.cold or not all(map(le, ts, islice(ts, 1, None))):
            inside = self.in_steps
            return (i for i, t in enumerate(ts) if inside(t))
        ranges = []
        steps = self.steps
        for i, (start, end, _) in enumerate(steps):  # as in_steps: the last step started
            after = steps[i + 1][0] if i + 1 < len(steps) else math.inf
            if after != start:
                ranges.append(range(bisect.bisect_left(ts, start),
                                    min(bisect.bisect_right(ts, end), bisect.bisect_left(ts, after))))
        return chain.from_iterable(ranges)

    def per_step(self, total_us: float) -> tuple[float, float]:
        """``(gain_ms, gain_share)`` of ``total_us`` spread over the captured steps."""
        gain = total_us / 1e3 / self.n_steps
        step = self.step_ms()
        return gain, (min(gain / step, 1.0) if step > 0 else 0.0)
