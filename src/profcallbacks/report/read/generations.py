"""One reading of every generation of Chrome-format torch.profiler traces.

torch.profiler has written its Chrome traces in two vocabularies:

- torch 1.8-1.13 (kineto's first years): CPU operators ``Operator``, CUDA runtime calls
  ``Runtime``, device work ``Kernel``, ``Memcpy``, ``Memset``, Python frames ``Python``; the
  ``ProfilerStep#N`` and ``enumerate(DataLoader)#...`` ranges are ``Operator`` events too; tids
  are strings (``"25738"``, ``"stream 7"``);
- torch 2.x: ``cpu_op``, ``cuda_runtime``/``cuda_driver``, ``kernel``, ``gpu_memcpy``,
  ``gpu_memset``, ``python_function``; ``record_function`` ranges (``ProfilerStep#N``, the
  DataLoader's ``enumerate(DataLoader)#...__next__``, Lightning's ``[_TrainingEpochLoop]...``)
  are ``user_annotation``, their device-side shadows ``gpu_user_annotation``; tids are numbers;
  timestamps are microseconds, as floats with nanosecond digits in newer versions
  (``ns_resolution`` traces).

:func:`normalise` rewrites a decoded trace, in place, into the 2.x vocabulary the rest of the
report reads, and puts each marker where the report looks for it whatever category carried it:
step ranges become ``user_annotation``, data-loader ranges ``cpu_op`` (an outermost range of the
host thread, as the project's own exporter writes them). It returns a :class:`TraceFormat` that
says what was found, so a trace that cannot be understood is named as such once ("CPU operators
not found: categories seen ...") instead of reading as empty.

Example:
    >>> from profcallbacks.report.read.decode import Event, Trace
    >>> trace = Trace(traceEvents=[Event(ph="X", cat="Operator", name="ProfilerStep#3", ts=0, dur=9)])
    >>> normalise(trace).generation, trace.traceEvents[0].cat
    ('torch 1.8-1.13', 'user_annotation')
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from profcallbacks.core.trace_names import (
    CPU_OP,
    GPU_CATEGORIES,
    HOST_CATEGORIES,
    LIGHTNING_PREFIXES,
    LOADER_PREFIXES,
    OLD_CATEGORIES,
    STEP_PREFIX,
    USER_ANNOTATION,
)
from profcallbacks.report.read.decode import Trace


@dataclass
class TraceFormat:
    """What :func:`normalise` saw in a trace.

    Attributes:
        generation: ``"torch 1.8-1.13"``, ``"torch 2.x"`` or ``"unknown"`` (no category of either).
        categories: Events per category as the trace wrote them (complete events only).
        cpu_ops: CPU operators found (after renaming).
        steps: ``ProfilerStep#`` ranges found, in any host category.
        loader_ranges: Data-loader ranges found, in any host category.
        device_events: Kernels, memcpys and memsets.
        ns_resolution: Timestamps carry fractions of a microsecond.
        device: ``deviceProperties`` of the first GPU (``name``, ``computeMajor`` ...), or ``{}``.
        framework: ``"lightning"`` when Lightning's own ranges are in the trace, else ``None``.
    """

    generation: str = "unknown"
    categories: dict[str, int] = field(default_factory=dict)
    cpu_ops: int = 0
    steps: int = 0
    loader_ranges: int = 0
    device_events: int = 0
    ns_resolution: bool = False
    device: dict[str, Any] = field(default_factory=dict)
    framework: str | None = None

    def problem(self) -> str | None:
        """One sentence naming what could not be understood, or ``None``."""
        if self.cpu_ops or not self.categories or self.device_events:
            return None  # GPU events alone are read: the GPU's span is the step
        seen = ", ".join(f"{c} ({n})" for c, n in sorted(self.categories.items(),
                                                          key=lambda kv: -kv[1])[:8])
        return (f"CPU operators not found: categories seen {seen}; expected cpu_op (torch 2.x) "
                "or Operator (torch 1.8-1.13)")

    def public(self) -> dict[str, Any]:
        """The JSON-friendly form written into the report (``trace_format``)."""
        return {"generation": self.generation, "cpu_ops": self.cpu_ops, "steps": self.steps,
                "loader_ranges": self.loader_ranges, "device_events": self.device_events,
                "ns_resolution": self.ns_resolution,
                "device": self.device.get("name") if self.device else None}


def normalise(trace: Trace) -> TraceFormat:
    """Rewrites ``trace``'s categories into the torch 2.x vocabulary, in place (idempotent).

    Returns:
        What was found (see :class:`TraceFormat`).
    """
    normaliser = Normaliser()
    normaliser.add(trace.traceEvents)
    return normaliser.format(getattr(trace, "deviceProperties", None))


_STEP, _LOADER = 1, 2
_KINDS_KEPT = 100_000
"""Distinct host event names whose kind is remembered (each step's name is one)."""


class Normaliser:
    """:func:`normalise` fed piece by piece (a streamed trace's pieces, in file order).

    Example:
        >>> from profcallbacks.report.read.decode import Event
        >>> n = Normaliser(); n.add([Event(ph="X", cat="Operator", name="aten::mm", ts=0, dur=1)])
        >>> n.format(None).cpu_ops
        1
    """

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self.old = self.modern = self.cpu_ops = self.steps = self.loaders = self.device = 0
        self.fractional = False
        self.framework: str | None = None
        self.kinds: dict[str, int] = {}  # host event name -> _STEP, _LOADER or 0 (see _kind)

    def add(self, events: list[Any]) -> None:
        """Rewrites ``events`` (decode.Event, or anything a hostile trace holds) in place."""
        seen = self.seen
        old = modern = cpu_ops = steps = loaders = device = 0
        fractional = self.fractional
        kinds = self.kinds
        for event in events:
            try:
                cat = event.cat
                if event.ph != "X" or type(cat) is not str:
                    continue
            except AttributeError:  # not an object: the readers count it as malformed
                continue
            seen[cat] += 1
            renamed = OLD_CATEGORIES.get(cat)
            if renamed is not None:
                old += 1
                event.cat = cat = renamed
            elif cat in HOST_CATEGORIES or cat in GPU_CATEGORIES:
                modern += 1
            if cat in GPU_CATEGORIES:
                device += 1
                continue
            if cat not in HOST_CATEGORIES:
                continue
            name = event.name
            if type(name) is not str:
                continue
            kind = kinds.get(name)
            if kind is None:
                kind = kinds[name] = self._kind(name) if len(kinds) < _KINDS_KEPT else -1
            if kind == -1:  # too many names to remember: tested each time
                kind = self._kind(name)
            if kind == _STEP:
                steps += 1
                event.cat = USER_ANNOTATION
            elif kind == _LOADER:
                loaders += 1
                event.cat = CPU_OP
            elif cat == CPU_OP:
                cpu_ops += 1
                if not fractional and type(event.ts) is float and event.ts % 1:
                    fractional = True
        self.old += old
        self.modern += modern
        self.cpu_ops += cpu_ops
        self.steps += steps
        self.loaders += loaders
        self.device += device
        self.fractional = fractional

    def _kind(self, name: str) -> int:
        """What a host event's name marks: a step range, a loader fetch or neither (0); a
        Lightning name sets the framework."""
        if name.startswith(LIGHTNING_PREFIXES):
            self.framework = "lightning"
        return _STEP if name.startswith(STEP_PREFIX) else _LOADER if name.startswith(
            LOADER_PREFIXES) else 0

    def format(self, properties: Any) -> TraceFormat:
        """What the pieces added so far held (``properties``: the trace's ``deviceProperties``)."""
        generation = ("torch 1.8-1.13" if self.old > self.modern else
                      "torch 2.x" if self.modern else "unknown")
        return TraceFormat(generation=generation, categories=dict(self.seen), cpu_ops=self.cpu_ops,
                           steps=self.steps, loader_ranges=self.loaders,
                           device_events=self.device, ns_resolution=self.fractional,
                           device=_device(properties), framework=self.framework)


def _device(props: Any) -> dict[str, Any]:
    if isinstance(props, list) and props and isinstance(props[0], dict):
        return props[0]
    return {}
