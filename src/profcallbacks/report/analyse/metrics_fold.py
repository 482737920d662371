"""Per-step metrics of several files or captures pooled one at a time (``captures.pool``), so a
capture of thousands of ranks is pooled as its summaries are read, not after holding them all.

Step-weighted means of the metrics, the span-weighted GPU breakdown and the step-weighted critical
path are running sums; the CPU operators and syncs, averaged over the files, keep each file's few
values (in arrays) until the count is known, so the pooled numbers equal those of the whole list.

Example:
    >>> fold = MetricsFold()
    >>> for ms in (10.0, 20.0):
    ...     fold.add({"step_ms": ms, "steps": 1, "gpu": None, "top_syncs": [], "top_cpu_ops": [],
    ...               **{k: 0.0 for k in METRIC_KEYS if k != "step_ms"}})
    >>> fold.result()["step_ms"]
    15.0
"""

from __future__ import annotations

from array import array
from collections import Counter
from typing import Any

from profcallbacks.report.analyse.advice import RunContext
from profcallbacks.report.analyse.expert import pool_diagnoses
from profcallbacks.report.analyse.verdict import decide

METRIC_KEYS = ("step_ms", "data_wait_ms", "cpu_ops_ms", "sync_ms", "optimizer_ms", "comm_call_ms",
               "comm_exposed_ms")
_RATES = ("step_ms", "steps_per_s", "flops_per_step", "achieved_tflops", "mfu")
"""Throughput's numbers averaged over a capture's files (``expert.pool_throughput``)."""
_PATH_MS = ("length_ms", "gpu_ms", "launch_ms", "host_ms", "data_ms")
_GPU_SHARES = ("idle_share", "compute_share", "non_compute_share", "comm_share",
               "comm_exposed_share", "memcpy_share")
_GPU_MEANS = ("comm_overlap_share", "idle_host_wait_share", "idle_kernel_wait_share",
              "idle_other_share", "short_kernel_share", "launch_delay_median_us")


class _GpuFold:
    """Span-weighted mean of several GPU breakdowns (one per rank or capture)."""

    def __init__(self) -> None:
        self.first: dict[str, Any] | None = None
        self.count = 0
        self.span: float = 0
        self.shares: dict[str, float] = dict.fromkeys(_GPU_SHARES, 0)
        self.means: dict[str, list[float]] = {k: [0, 0] for k in _GPU_MEANS}
        self.kernels = 0
        self.memcpy: dict[str, dict[str, float]] = {}
        self.top: dict[str, float] = {}

    def add(self, g: dict[str, Any]) -> None:
        if self.first is None:
            self.first = g
        self.count += 1
        self.span += g["span_ms"]
        for key in _GPU_SHARES:
            self.shares[key] += g[key] * g["span_ms"]
        for key in _GPU_MEANS:
            if g[key] is not None:
                self.means[key][0] += g[key]
                self.means[key][1] += 1
        self.kernels += g["kernels"]
        for name, row in g["memcpy"].items():
            acc = self.memcpy.setdefault(name, {"count": 0, "ms": 0.0})
            acc["count"] += row["count"]
            acc["ms"] += row["ms"]
        for row in g["top_kernels"]:
            self.top[row["name"]] = self.top.get(row["name"], 0.0) + row["ms"]

    def result(self) -> dict[str, Any] | None:
        if self.first is None or self.count == 1:
            return self.first  # one breakdown: itself
        out = dict(self.first)
        out["span_ms"] = self.span
        for key in _GPU_SHARES:
            out[key] = self.shares[key] / self.span
        for key in _GPU_MEANS:
            total, n = self.means[key]
            out[key] = total / n if n else None
        out["kernels"] = self.kernels
        out["memcpy"] = self.memcpy
        out["top_kernels"] = [{"name": n, "ms": v}
                              for n, v in sorted(self.top.items(), key=lambda kv: -kv[1])[:3]]
        return out


class _PathFold:
    """Step-weighted mean of several files' or captures' critical paths."""

    def __init__(self) -> None:
        self.steps = 0
        self.sums: dict[str, float] = dict.fromkeys((*_PATH_MS, "host_share_median"), 0)

    def add(self, p: dict[str, Any] | None) -> None:
        if not p or not p.get("steps"):
            return
        self.steps += int(p["steps"])
        for key in _PATH_MS:
            self.sums[key] += p[key] * p["steps"]
        self.sums["host_share_median"] += p.get("host_share_median", p["host_share"]) * p["steps"]

    def result(self) -> dict[str, Any] | None:
        if not self.steps:
            return None
        steps = self.steps
        out: dict[str, Any] = {k: self.sums[k] / steps for k in _PATH_MS}
        length = out["length_ms"]
        out["gpu_share"] = out["gpu_ms"] / length if length > 0 else 0.0
        out["host_share"] = 1.0 - out["gpu_share"] if length > 0 else 0.0
        out["host_share_median"] = self.sums["host_share_median"] / steps
        out["bound"] = "gpu" if out["host_share_median"] <= 0.5 else "host"
        out["steps"] = steps
        return out


class MetricsFold:
    """Per-step metrics of several files or captures, pooled as they are added (step-weighted
    means); ``result`` is ``captures.pool`` of everything added."""

    def __init__(self) -> None:
        self.count = 0
        self.steps = 0
        self.sums: dict[str, float] = dict.fromkeys(METRIC_KEYS, 0)
        self.gpu = _GpuFold()
        self.tops: dict[str, dict[str, array[float]]] = {"top_syncs": {}, "top_cpu_ops": {}}
        self.path = _PathFold()
        self.graph_capture: Any = None
        self.dtypes: Counter[str] = Counter()

    def add(self, m: dict[str, Any]) -> None:
        """Adds one file's (or capture's) metrics; those with neither a step nor GPU events are
        left out."""
        if not (m.get("step_ms") or m.get("gpu")):
            return
        self.count += 1
        weight = max(m["steps"], 1)
        self.steps += weight
        for key in METRIC_KEYS:
            self.sums[key] += m[key] * weight
        if m["gpu"] is not None:
            self.gpu.add(m["gpu"])
        for key, value in (("top_syncs", "ms"), ("top_cpu_ops", "self_ms")):
            for row in m[key]:
                self.tops[key].setdefault(row["name"], array("d")).append(row[value])
        self.path.add(m.get("critical_path"))
        self.graph_capture = self.graph_capture or m.get("graph_capture") or None
        if m.get("dtype"):
            self.dtypes[m["dtype"]] += 1

    def result(self) -> dict[str, Any] | None:
        """The pooled metrics, or ``None`` when nothing was added."""
        if not self.count:
            return None
        out: dict[str, Any] = {k: self.sums[k] / self.steps for k in METRIC_KEYS}
        out["steps"] = self.steps
        out["gpu"] = self.gpu.result()
        for key, value in (("top_syncs", "ms"), ("top_cpu_ops", "self_ms")):
            acc: dict[str, float] = {}
            for name, values in self.tops[key].items():
                total = 0.0
                for v in values:
                    total += v / self.count
                acc[name] = total
            out[key] = [{"name": n, value: v}
                        for n, v in sorted(acc.items(), key=lambda kv: -kv[1])[:3]]
        out["critical_path"] = self.path.result()
        out["graph_capture"] = self.graph_capture
        out["dtype"] = max(self.dtypes, key=lambda d: self.dtypes[d]) if self.dtypes else None
        return out


class CaptureFold:
    """One capture's files (``metrics``, ``diagnoses``, ``throughput`` and ``rank`` of each
    file's analysis) pooled as they are added; ``result`` is ``captures.capture_analysis``."""

    def __init__(self) -> None:
        self.metrics = MetricsFold()
        self.diagnoses: list[tuple[str, list[dict[str, Any]]]] = []
        self.throughput: dict[str, Any] | None = None  # the first file's, then running sums
        self.rates: dict[str, list[float]] = {k: [0, 0] for k in _RATES}

    def add(self, f: dict[str, Any]) -> None:
        """Adds one file's analysis."""
        if "metrics" in f:
            self.metrics.add(f["metrics"])
        self.diagnoses.append((f"rank {f.get('rank', '-')}", f.get("diagnoses") or []))
        row = f.get("throughput")
        if row:
            self.throughput = self.throughput or row
            for key in _RATES:
                if row.get(key) is not None:
                    self.rates[key][0] += row[key]
                    self.rates[key][1] += 1

    def result(self, sync_sites: list[str], *, context: RunContext | None = None,
               previous: str | None = None) -> dict[str, Any]:
        """``metrics``, ``verdict``, ``diagnoses`` and ``throughput`` of the capture."""
        metrics = self.metrics.result()
        diagnoses = pool_diagnoses(self.diagnoses)
        return {"metrics": metrics,
                "verdict": decide(metrics, sync_sites, context=context, previous=previous,
                                  diagnoses=diagnoses) if metrics else None,
                "diagnoses": diagnoses, "throughput": self._throughput()}

    def _throughput(self) -> dict[str, Any] | None:
        """The mean of the files' throughput (``expert.pool_throughput``)."""
        if self.throughput is None:
            return None
        out = dict(self.throughput)
        for key in _RATES:
            total, n = self.rates[key]
            out[key] = total / n if n else None
        return out
