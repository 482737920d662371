"""Step-time statistics of a run: whole run, per rank, stragglers, and the traced-step breakdown."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from profcallbacks.core.timing import median
from profcallbacks.detect.straggler import slow_ranks
from profcallbacks.report.analyse.trace_fold import OpTotals, StepSums
from profcallbacks.report.read.traces import TraceSummary

INTERVAL_KEYS = ("rank", "first_step", "last_step", "steps", "step_time_ms", "step_time_ms_median",
                 "step_time_ms_max", "data_wait_ms", "data_wait_share")


COUNTED_KEYS = ("max_step", "steps_excluded", "counted_data_wait_ms")
"""Fields of steps-file rows written since whole-run statistics left excluded steps out."""

_OLD_NAMES = {"healthy_us": "counted_us", "healthy_data_wait_ms": "counted_data_wait_ms"}
"""What the counted steps' fields were called in 0.2 (its steps files are read too)."""


def clean_intervals(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of the steps files that hold every field as a number, in step then rank order.

    Rows that also list their counted steps (``counted_us`` and :data:`COUNTED_KEYS`; in 0.2
    ``healthy_us`` and ``healthy_data_wait_ms``) keep them, as ``counted_ms``.
    """
    out = []
    for row in rows:
        if all(isinstance(row.get(k), (int, float)) for k in INTERVAL_KEYS) and row["steps"] > 0:
            clean = {k: row[k] for k in INTERVAL_KEYS}
            row = {_OLD_NAMES.get(k, k): v for k, v in row.items()}
            counted = row.get("counted_us")
            if (isinstance(counted, list) and all(isinstance(row.get(k), (int, float))
                                                  for k in COUNTED_KEYS)
                    and all(isinstance(v, int) and not isinstance(v, bool) for v in counted)):
                clean.update({k: row[k] for k in COUNTED_KEYS},
                             counted_ms=[v / 1e3 for v in counted])
            out.append(clean)
    out.sort(key=lambda r: (r["first_step"], r["rank"]))
    return out


def percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank ``q`` percentile (0-100) of the sorted, non-empty ``ordered``."""
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    steps = sum(r["steps"] for r in rows)
    out: dict[str, Any] = {
        "steps": steps,
        "first_step": min(r["first_step"] for r in rows),
        "last_step": max(r["last_step"] for r in rows),
    }
    counted = [v for r in rows for v in r.get("counted_ms", ())]
    if counted and all("counted_ms" in r for r in rows):  # exact, over the counted steps
        ordered = sorted(counted)
        total = sum(counted)
        mean = total / len(counted)
        wait = sum(r["counted_data_wait_ms"] for r in rows) / len(counted)
        slowest = max((r for r in rows if r["counted_ms"]), key=lambda r: max(r["counted_ms"]))
        out.update(mean_ms=mean, median_ms=percentile(ordered, 50),
                   p90_ms=percentile(ordered, 90), p99_ms=percentile(ordered, 99),
                   max_ms=ordered[-1], max_step=int(slowest["max_step"]),
                   steps_excluded=int(sum(r["steps_excluded"] for r in rows)),
                   steps_per_s=len(counted) / total * 1e3 if total > 0 else None)
    else:  # steps files of older versions: interval aggregates only
        mean = sum(r["step_time_ms"] * r["steps"] for r in rows) / steps
        wait = sum(r["data_wait_ms"] * r["steps"] for r in rows) / steps
        out.update(mean_ms=mean,
                   median_ms=median(r["step_time_ms_median"] for r in rows),
                   p90_ms=None, p99_ms=None, max_ms=max(r["step_time_ms_max"] for r in rows),
                   max_step=None, steps_excluded=0,
                   steps_per_s=1e3 / mean if mean > 0 else None)
    out.update(data_wait_ms=wait, data_wait_share=wait / mean if mean > 0 else 0.0)
    return out


def step_stats(intervals: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Whole-run and per-rank statistics from the steps files; ``None`` without any rows.

    Steps inside capture windows, under the sync audit or during exports are left out and
    counted in ``steps_excluded``; over the other steps ``mean_ms``, ``median_ms``, ``p90_ms``,
    ``p99_ms`` (nearest rank), ``max_ms`` (of step ``max_step``), ``data_wait_ms`` and
    ``steps_per_s`` (counted steps per second of their own time) are exact. Steps files of
    older versions give interval aggregates (``median_ms`` of interval medians, no percentiles).
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
    stats["intervals"] = [{k: v for k, v in r.items() if k != "counted_ms"} for r in intervals]
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
    sums = StepSums()
    for trace in traces:
        sums.add(trace)
    return sums.result()


def top_operators(traces: list[TraceSummary], limit: int) -> dict[str, list[dict[str, Any]]]:
    """The ``limit`` operators with most self time, CPU and GPU, summed over traces and ranks."""
    totals = OpTotals()
    for trace in traces:
        totals.add(trace)
    return totals.top(limit)
