"""Traces folded one at a time into the report's run-wide totals, so a report of thousands of ranks
holds running sums, not every rank's trace summary.

``StepSums`` is the traced-step breakdown (``stats.breakdown``), ``OpTotals`` the operator tables
(``stats.top_operators``): each adds one trace's numbers in the order the traces are read, so the
totals equal those of the whole list. ``RunTraces`` keeps what the report needs of every trace it
read: the breakdown and operator totals of the traces each run-wide view chooses (healthy
captures of the latest run, ...), the operator names, trace formats (one per distinct kind), ranks
and world size the run's context is made of.

Example:
    >>> sums = StepSums()
    >>> sums.result() is None
    True
"""

from __future__ import annotations

import json
from typing import Any

from profcallbacks.report.read.generations import TraceFormat
from profcallbacks.report.read.traces import TraceSummary

_PARTS = ("data_wait_ms", "compute_ms", "other_ms")


class StepSums:
    """Running sums of traced steps (``ProfilerStep`` ranges, every rank's) for their mean
    breakdown; ``rows`` holds the per-step rows of the traces added with ``keep=True``."""

    def __init__(self) -> None:
        self.traces = 0
        self.n = 0
        self.sums: dict[str, float] = {"step_ms": 0, **{k: 0 for k in _PARTS}, "compiled_ms": 0}
        self.gpu: float = 0
        self.gpu_n = 0
        self.rows: list[dict[str, Any]] = []

    def add(self, trace: TraceSummary, *, keep: bool = True) -> None:
        """Adds ``trace``'s steps (its rows too when ``keep``)."""
        self.traces += 1
        for s in trace.steps:
            self.n += 1
            for key in ("step_ms", *_PARTS):
                self.sums[key] += s[key]
            self.sums["compiled_ms"] += s.get("compiled_ms", 0.0)
            if s["gpu_kernel_ms"] is not None:
                self.gpu += s["gpu_kernel_ms"]
                self.gpu_n += 1
        if keep:
            self.rows += step_rows(trace)

    def result(self, per_step: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
        """The breakdown of ``stats.breakdown`` (``per_step``: these rows instead of ``rows``)."""
        if not self.n:
            return None
        n = self.n
        step = self.sums["step_ms"] / n
        out: dict[str, Any] = {"source": "traces", "steps": n, "step_ms": step}
        for key in _PARTS:
            out[key] = self.sums[key] / n
            out[key.replace("_ms", "_share")] = out[key] / step if step > 0 else 0.0
        out["gpu_kernel_ms"] = self.gpu / self.gpu_n if self.gpu_n else None
        compiled = self.sums["compiled_ms"] / n
        out["compiled_ms"] = compiled
        out["compiled_share"] = compiled / step if step > 0 else 0.0
        out["per_step"] = self.rows if per_step is None else per_step
        return out


def step_rows(trace: TraceSummary) -> list[dict[str, Any]]:
    """``trace``'s per-step rows as the breakdown lists them (with its capture and rank)."""
    return [{"capture": trace.path.parent.name, "rank": trace.rank, **s} for s in trace.steps]


class OpTotals:
    """CPU and GPU operator totals summed over traces: name -> [calls, self ms, total ms]."""

    def __init__(self) -> None:
        self.cpu: dict[str, list[float]] = {}
        self.gpu: dict[str, list[float]] = {}
        self.steps = 0

    def add(self, trace: TraceSummary) -> None:
        """Adds ``trace``'s operator tables and step count."""
        self.steps += len(trace.steps)
        for name, row in trace.cpu_ops.items():
            acc = self.cpu.setdefault(name, [0, 0.0, 0.0])
            for i in range(3):
                acc[i] += row[i]
        for name, row in trace.gpu_ops.items():
            acc = self.gpu.setdefault(name, [0, 0.0])
            acc[0] += row[0]
            acc[1] += row[1]

    def top(self, limit: int) -> dict[str, list[dict[str, Any]]]:
        """The ``limit`` operators with most self time, CPU and GPU."""
        steps = max(self.steps, 1)
        cpu_rows = sorted(self.cpu.items(), key=lambda kv: -kv[1][1])[:limit]
        gpu_rows = sorted(self.gpu.items(), key=lambda kv: -kv[1][1])[:limit]
        return {
            "cpu": [{"name": n, "calls": int(r[0]), "self_ms": r[1], "total_ms": r[2],
                     "self_ms_per_step": r[1] / steps} for n, r in cpu_rows],
            "gpu": [{"name": n, "calls": int(r[0]), "self_ms": r[1], "total_ms": r[1],
                     "self_ms_per_step": r[1] / steps} for n, r in gpu_rows],
        }


def _kind(fmt: TraceFormat) -> tuple[Any, ...]:
    """What the run's context reads of a format: formats alike in it need not all be kept."""
    return (bool(fmt.device_events), json.dumps(fmt.device, sort_keys=True, default=str),
            fmt.framework, tuple(sorted(c for c, n in fmt.categories.items() if n)))


class RunTraces:
    """Every trace the report read, folded: see the module's docstring.

    The run-wide views choose among the traces by their capture: ``healthy`` (not taken on a
    slowdown or stall) and ``earlier`` (a capture of an earlier run of a restarted job).
    """

    def __init__(self) -> None:
        self.count = 0
        self.names: set[str] = set()
        self.ranks: set[int] = set()
        self.world_size = 0
        self._formats: dict[tuple[Any, ...], TraceFormat] = {}
        self._healthy = 0
        self._steps = {key: StepSums() for key in ("healthy_latest", "healthy", "latest", "all")}
        self._ops = {key: OpTotals() for key in ("latest", "all")}
        self._latest = 0

    def add(self, trace: TraceSummary, *, healthy: bool, earlier: bool) -> None:
        """Folds ``trace`` (read from a ``healthy`` capture, of an ``earlier`` run or not)."""
        self.count += 1
        self.names.update(trace.cpu_ops)
        self.ranks.add(trace.rank)
        self.world_size = max(self.world_size, trace.world_size)
        self._formats.setdefault(_kind(trace.format), trace.format)
        self._healthy += healthy
        for key, chosen in (("healthy_latest", healthy and not earlier), ("healthy", healthy),
                            ("latest", not earlier), ("all", True)):
            if chosen:
                self._steps[key].add(trace, keep=False)
        if not earlier:
            self._latest += 1
            self._ops["latest"].add(trace)
        self._ops["all"].add(trace)

    def formats(self) -> list[TraceFormat]:
        """One format of each kind the run's context tells apart, in the order first read."""
        return list(self._formats.values())

    def breakdown(self, per_step: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The run's breakdown: the healthy captures' traces of the latest run (failing that,
        the healthy ones; all traces when no capture is healthy); ``per_step``: its rows."""
        healthy, latest = self.chosen()
        key = {(True, True): "healthy_latest", (True, False): "healthy", (False, True): "latest",
               (False, False): "all"}[(healthy, latest)]
        return self._steps[key].result(per_step)

    def chosen(self) -> tuple[bool, bool]:
        """``(healthy, latest)``: which captures' traces the run's breakdown is made of (only
        healthy captures', only the latest run's)."""
        healthy = self._healthy > 0
        return healthy, self._steps["healthy_latest" if healthy else "latest"].traces > 0

    def top_operators(self, limit: int) -> dict[str, list[dict[str, Any]]]:
        """The run's operator tables: the latest run's traces (all when none)."""
        return self._ops["latest" if self._latest else "all"].top(limit)
