"""The text of a capture's job view (``report/analyse/ranks.py``): a few lines for any rank count."""

from __future__ import annotations

from typing import Any

_PARTS = (("step_ms", "step"), ("data_wait_ms", "data wait"), ("compute_ms", "compute"),
          ("comm_ms", "communication"))


def job_lines(directory: str, job: dict[str, Any] | None) -> list[str]:
    """Lines for the capture ``directory``'s job view; none for a capture of one rank.

    Example:
        >>> job_lines("step000004-schedule", {"ranks": 2, "sentence": "2 ranks host_bound",
        ...     "distributions": {"step_ms": {"median": 1.0, "p99": 2.0, "worst": 2.0,
        ...                                   "worst_rank": 1}}, "stragglers": []})[0]
        '  step000004-schedule: 2 ranks: 2 ranks host_bound'
    """
    if not job:
        return []
    out = [f"  {directory}: {job['ranks']} ranks: {job['sentence']}"]
    dist = job.get("distributions") or {}
    cells = [f"{label} {d['median']:.2f}/{d['p99']:.2f}/{d['worst']:.2f} (rank {d['worst_rank']})"
             for key, label in _PARTS if (d := dist.get(key))]
    if cells:
        out.append("    ms per step, median/p99/worst (worst rank): " + "; ".join(cells))
    for s in job.get("stragglers") or []:
        out.append(f"    straggler rank {s['rank']} on {s['host']}: the others wait "
                   f"{s['others_wait_ms']:.2f} ms per step for it in collectives (last to arrive "
                   f"in {s['last_share']:.0%} of them)")
    return out
