"""Step-time statistics of a run: whole run, per rank, stragglers, and the traced-step breakdown."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from profcallbacks.core.timing import median
from profcallbacks.detect.straggler import slow_ranks
from profcallbacks.report.traces import TraceSummary

INTERVAL_KEYS = ("rank", "first_step", "last_step", "steps", "step_time_ms", "step_time_ms_median",
                 "step_time_ms_max", "data_wait_ms", "data_wait_share")


def clean_intervals(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of the steps files that hold every field as a number, in step then rank order."""
    out = []
    for row in rows:
        if all(isinstance(row.get(k), (int, float)) for k in INTERVAL_KEYS) and row["steps"] > 0:
            out.append({k: row[k] for k in INTERVAL_KEYS})
    out.sort(key=lambda r: (r["first_step"], r["rank"]))
    return out


def _aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    steps = sum(r["steps"] for r in rows)
    mean = sum(r["step_time_ms"] * r["steps"] for r in rows) / steps
    wait = sum(r["data_wait_ms"] * r["steps"] for r in rows) / steps
    return {
        "steps": steps,
        "first_step": min(r["first_step"] for r in rows),
        "last_step": max(r["last_step"] for r in rows),
        "mean_ms": mean,
        "median_ms": median(r["step_time_ms_median"] for r in rows),
        "max_ms": max(r["step_time_ms_max"] for r in rows),
        "data_wait_ms": wait,
        "data_wait_share": wait / mean if mean > 0 else 0.0,
    }


def step_stats(intervals: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Whole-run and per-rank statistics from the steps files; ``None`` without any rows.

    ``mean_ms`` and ``data_wait_ms`` are exact means over all steps; ``median_ms`` is the median
    of the interval medians (the steps files keep no single steps); ``max_ms`` is exact.
    """
    if not intervals:
        return None
    ranks = sorted({r["rank"] for r in intervals})
    per_rank = [{"rank": rank, **_aggregate([r for r in intervals if r["rank"] == rank])}
                for rank in ranks]
    for row in per_rank:
        row["steps"] = int(row["steps"])
    overall = _aggregate(intervals)
    overall["steps"] = max(r["steps"] for r in per_rank)  # optimizer steps, not rank-steps
    stats: dict[str, Any] = {"source": "steps.jsonl", **overall, "per_rank": per_rank,
                             "slowest_rank": None, "data_wait_share_spread": None, "stragglers": []}
    if len(per_rank) > 1:
        stats.update(rank_comparison(per_rank))
    stats["intervals"] = intervals
    return stats


def rank_comparison(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Slowest rank, spread of data-wait share (max - min), and stragglers with their reason.

    Stragglers follow the same rule as the live check (``detect.straggler.slow_ranks``): each
    rank's median step time and mean data wait against the other ranks' median.
    """
    slowest = max(per_rank, key=lambda r: r["mean_ms"])
    shares = [r["data_wait_share"] for r in per_rank]
    slow = slow_ranks({r["rank"]: (r["median_ms"], r["data_wait_ms"]) for r in per_rank})
    stragglers = []
    for row in per_rank:
        verdict = slow.get(row["rank"])
        if verdict is None:
            continue
        reasons = []
        if verdict.slow_step_time:
            reasons.append(f"median step time {verdict.ratio:.2f}x the other ranks'")
        if verdict.slow_data_wait:
            reasons.append(f"waits {verdict.extra_data_wait_s:.1f} ms/step longer for data than "
                           "the other ranks")
        stragglers.append({"rank": row["rank"], "mean_ms": row["mean_ms"],
                           "median_ms": row["median_ms"], "step_ratio": verdict.ratio,
                           "extra_data_wait_ms": verdict.extra_data_wait_s,
                           "reason": "; ".join(reasons)})
    return {"slowest_rank": slowest["rank"], "data_wait_share_spread": max(shares) - min(shares),
            "stragglers": stragglers}


def breakdown(traces: list[TraceSummary]) -> dict[str, Any] | None:
    """Mean breakdown of the traced steps (over every rank's ``ProfilerStep`` ranges)."""
    rows = [s for t in traces for s in t.steps]
    if not rows:
        return None
    n = len(rows)
    step = sum(r["step_ms"] for r in rows) / n
    out: dict[str, Any] = {"source": "traces", "steps": n, "step_ms": step}
    for key in ("data_wait_ms", "compute_ms", "other_ms"):
        out[key] = sum(r[key] for r in rows) / n
        out[key.replace("_ms", "_share")] = out[key] / step if step > 0 else 0.0
    gpu = [r["gpu_kernel_ms"] for r in rows if r["gpu_kernel_ms"] is not None]
    out["gpu_kernel_ms"] = sum(gpu) / len(gpu) if gpu else None
    out["per_step"] = [{"capture": t.path.parent.name, "rank": t.rank, **s}
                       for t in traces for s in t.steps]
    return out


def top_operators(traces: list[TraceSummary], limit: int) -> dict[str, list[dict[str, Any]]]:
    """The ``limit`` operators with most self time, CPU and GPU, summed over traces and ranks."""
    steps = max(sum(len(t.steps) for t in traces), 1)
    cpu: dict[str, list[float]] = {}
    gpu: dict[str, list[float]] = {}
    for trace in traces:
        for name, row in trace.cpu_ops.items():
            acc = cpu.setdefault(name, [0, 0.0, 0.0])
            for i in range(3):
                acc[i] += row[i]
        for name, row in trace.gpu_ops.items():
            acc = gpu.setdefault(name, [0, 0.0])
            acc[0] += row[0]
            acc[1] += row[1]
    cpu_rows = sorted(cpu.items(), key=lambda kv: -kv[1][1])[:limit]
    gpu_rows = sorted(gpu.items(), key=lambda kv: -kv[1][1])[:limit]
    return {
        "cpu": [{"name": n, "calls": int(r[0]), "self_ms": r[1], "total_ms": r[2],
                 "self_ms_per_step": r[1] / steps} for n, r in cpu_rows],
        "gpu": [{"name": n, "calls": int(r[0]), "self_ms": r[1], "total_ms": r[1],
                 "self_ms_per_step": r[1] / steps} for n, r in gpu_rows],
    }
