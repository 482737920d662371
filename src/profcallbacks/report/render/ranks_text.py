"""The text of a capture's job view (``report/analyse/ranks.py``): a few lines for any rank count."""

from __future__ import annotations

from typing import Any

LISTED_FILES = 8
"""A capture's files named in the captures table; beyond, the first few and a count."""
_PARTS = (("step_ms", "step"), ("data_wait_ms", "data wait"), ("compute_ms", "compute"),
          ("comm_ms", "communication"))


def file_list(names: list[str]) -> str:
    """The captures table's files cell: every name up to ``LISTED_FILES``, else the first three
    and how many more (a job of thousands of ranks is one line, not thousands of names).

    Example:
        >>> file_list([f"rank{r}.json" for r in range(10)])
        'rank0.json, rank1.json, rank2.json and 7 more (10 files)'
    """
    if not names:
        return "-"
    if len(names) <= LISTED_FILES:
        return ", ".join(names)
    return f"{', '.join(names[:3])} and {len(names) - 3} more ({len(names)} files)"


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
