"""One capture's ranks read as one job: distributions, stragglers by host, verdict clusters.

A job of thousands of ranks needs no table of thousands of rows: per capture, the median, p99 and
worst rank of step time, data wait, compute and communication; the ranks the others wait for in
collectives (stragglers), grouped by host; and the ranks clustered by verdict ("1020 ranks
gpu_compute_bound; 4 ranks host_bound on node-17").

Stragglers come from collective wait times (``rank_summary.collective_calls``): in each
collective, a rank that arrives early waits for the last one, so the last to arrive waits least.
For each collective call matched across ranks (same captured step, same position in it) a rank's
lateness is the median wait of all ranks minus its own wait; a straggler is a rank whose lateness,
summed over a step's collectives, is at least ``MIN_STEP_SHARE`` of the median step and stands
out from the other ranks' (``OUTLIER_MADS`` median absolute deviations), or comes close to the
latest rank's while the others fall well short of it (``NEAR_WORST``, ``SET_APART``: on 8 DLRM
ranks, three arrive 7 ms after the first in an all-to-all, one 5.5 ms and four within 3 ms; the
median rank waits 3.4-5.2 ms per step for each of the three, under 2 ms for the others). Clock offsets between
hosts do not matter: only durations on each rank's own clock are compared.

Example:
    >>> rows = [{"rank": r, "host": f"n{r // 2}", "metrics": {"step_ms": 10.0 + r},
    ...          "collectives": [[0, 1.0, 5.0 if r < 3 else 0.1]]} for r in range(4)]
    >>> view = job_view(rows, [{"rank": r, "kind": "host_bound"} for r in range(4)])
    >>> [s["rank"] for s in view["stragglers"]], view["clusters"][0]["count"]
    ([3], 4)
"""

from __future__ import annotations

import statistics
from array import array
from collections import Counter, defaultdict
from typing import Any

MIN_STEP_SHARE = 0.05
"""A straggler costs the others at least this share of the median step in collective waits."""
OUTLIER_MADS = 5.0
"""... and its lateness lies this many median absolute deviations above the ranks' median ..."""
NEAR_WORST = 0.5
"""... or is at least this share of the latest rank's, when those ranks stand apart from the rest
(``SET_APART``): a few late ranks among a handful (3 of 8) spread the ranks' lateness too wide for
the deviations to tell them."""
SET_APART = 0.75
"""The other ranks' lateness is at most this share of the least late of those near the latest."""
SET_APART_FROM = 4
"""Ranks matched in collectives for ``NEAR_WORST`` to apply: with fewer, "the others" is one or two
ranks (two unrelated traces in one directory are not a job)."""
SHOWN_RANKS = 16
"""Ranks named per cluster or host; the rest are counted."""
POSITION_BITS = 20
"""A collective call's key: its step shifted by this many bits, plus its position in the step."""
DETAIL_UP_TO = 64
"""Captures of this many ranks keep every rank's per-step rows in the report; larger ones keep
them only for the ranks that stand out (``detail_ranks``)."""


def _quantile(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile of ``sorted_values`` (nearest rank, as a p99 of ranks is read)."""
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def parts(metrics: dict[str, Any]) -> dict[str, float]:
    """Step time, data wait, compute and communication (ms per step) of one rank's metrics."""
    step = float(metrics.get("step_ms") or 0.0)
    gpu = metrics.get("gpu")
    comm = float(metrics.get("comm_call_ms") or 0.0)
    if isinstance(gpu, dict) and gpu.get("kernels"):
        compute = float(gpu.get("compute_share") or 0.0) * step
        comm = max(comm, float(gpu.get("comm_share") or 0.0) * step)
    else:  # host operators (a gloo collective waits on threads of its own, counted in comm)
        compute = float(metrics.get("cpu_ops_ms") or 0.0)
    return {"step_ms": step, "data_wait_ms": float(metrics.get("data_wait_ms") or 0.0),
            "compute_ms": compute, "comm_ms": comm}


def _row_parts(row: dict[str, Any]) -> dict[str, float] | None:
    """A row's parts (``summarize.rank_row``), or those of its ``metrics``."""
    if "parts" in row:
        return row["parts"]
    return parts(row["metrics"]) if row.get("metrics") else None


_SHARED_KEYS: dict[bytes, array[int]] = {}
"""Sequences of call keys seen lately, each held once (read only)."""


def call_waits(calls: Any) -> tuple[array[int], array[float]]:
    """Collective calls (``[step, arrival ms, wait ms]`` each) as two arrays: each call's key
    (step and position in it, ``step << POSITION_BITS | position``) and its wait (ms)."""
    if isinstance(calls, tuple):
        return calls
    position: Counter[int] = Counter()
    order = []
    for step, _arrival, _wait in calls:
        step = int(step)
        order.append(step << POSITION_BITS | position[step])
        position[step] += 1
    keys = array("q", order)
    if len(_SHARED_KEYS) >= 16:  # the ranks of a job mostly share one sequence of calls
        _SHARED_KEYS.clear()
    return (_SHARED_KEYS.setdefault(keys.tobytes(), keys),
            array("d", [float(wait) for _step, _arrival, wait in calls]))


def distributions(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per part: ``{"median", "p99", "worst", "worst_rank"}`` over the ranks (ms per step)."""
    per_rank = [(row.get("rank"), p) for row in rows if (p := _row_parts(row))]
    out: dict[str, dict[str, Any]] = {}
    if not per_rank:
        return out
    for key in ("step_ms", "data_wait_ms", "compute_ms", "comm_ms"):
        values = sorted(parts[key] for _, parts in per_rank)
        worst_rank = max(per_rank, key=lambda rp: rp[1][key])[0]
        out[key] = {"median": statistics.median(values), "p99": _quantile(values, 0.99),
                    "worst": values[-1], "worst_rank": worst_rank}
    return out


def lateness(rows: list[dict[str, Any]]) -> dict[int, tuple[float, float]]:
    """Per rank: (ms per captured step the median rank waits for it in collectives, share of
    matched collectives it arrived last in).

    One collective call at a time across the ranks (each rank's calls are in key order), so
    what it holds beyond the rows is one call's waits.
    """
    ranks, keys, waits = [], [], []
    for row in rows:
        rank = row.get("rank")
        if isinstance(rank, int):
            k, w = call_waits(row.get("collectives") or [])
            ranks.append(rank)
            keys.append(k)
            waits.append(w)
    late: dict[int, float] = defaultdict(float)
    last: Counter[int] = Counter()
    matched: Counter[int] = Counter()
    quorum = max(2, len(rows) // 2)
    cursor = [0] * len(ranks)
    for key in sorted(set().union(*keys)):
        found: dict[int, float] = {}
        for i, rank in enumerate(ranks):
            j = cursor[i]
            if j < len(keys[i]) and keys[i][j] == key:
                found[rank] = waits[i][j]
                cursor[i] = j + 1
        if len(found) < quorum:
            continue
        median = statistics.median(found.values())
        for rank, wait in found.items():
            late[rank] += max(median - wait, 0.0)
            matched[rank] += 1
        last[min(found, key=lambda r: found[r])] += 1
    steps = {rank: len({k >> POSITION_BITS for k in ks}) for rank, ks in zip(ranks, keys, strict=True)}
    return {rank: (late[rank] / max(steps[rank], 1), last[rank] / matched[rank])
            for rank in matched}


def stragglers(rows: list[dict[str, Any]], step_ms: float) -> list[dict[str, Any]]:
    """The ranks the others wait for: ``{"rank", "host", "others_wait_ms", "last_share"}``,
    the costliest first (``others_wait_ms``: per captured step, in collectives)."""
    found = lateness(rows)
    if len(found) < 2:
        return []
    values = [v[0] for v in found.values()]
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    outlier = median + OUTLIER_MADS * mad
    near = [v for v in values if v >= NEAR_WORST * max(values)]
    rest = [v for v in values if v < NEAR_WORST * max(values)]
    if len(values) >= SET_APART_FROM and rest and max(rest) <= SET_APART * min(near):
        outlier = min(outlier, min(near))
    floor = max(MIN_STEP_SHARE * step_ms, outlier)
    hosts = {row.get("rank"): row.get("host") for row in rows}
    out = [{"rank": rank, "host": hosts.get(rank), "others_wait_ms": ms, "last_share": share}
           for rank, (ms, share) in found.items() if ms > 0 and ms >= floor]
    return sorted(out, key=lambda s: -s["others_wait_ms"])


def _named(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:SHOWN_RANKS]))
    return shown + (f" and {len(ranks) - SHOWN_RANKS} more" if len(ranks) > SHOWN_RANKS else "")


def clusters(verdicts: list[dict[str, Any]], hosts: dict[Any, Any]) -> list[dict[str, Any]]:
    """Ranks grouped by verdict kind: ``{"kind", "count", "ranks", "hosts"}``, largest first;
    ``hosts`` lists the hosts of a minority kind (where the odd ranks run)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for v in verdicts:
        groups[str(v["kind"])].append(v["rank"])
    out = []
    for kind, ranks in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        on = Counter(str(hosts.get(r)) for r in ranks if hosts.get(r) is not None)
        out.append({"kind": kind, "count": len(ranks), "ranks": sorted(ranks),
                    "hosts": [h for h, _ in on.most_common()]})
    return out


def job_view(rows: list[dict[str, Any]], verdicts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The job view of one capture's rank rows (``summarize.rank_row``) and rank verdicts;
    ``None`` for a capture of one rank."""
    if len(rows) < 2:
        return None
    dist = distributions(rows)
    step_ms = dist["step_ms"]["median"] if dist else 0.0
    slow = stragglers(rows, step_ms)
    hosts = {row.get("rank"): row.get("host") for row in rows}
    groups = clusters(verdicts, hosts)
    by_host: dict[str, list[int]] = defaultdict(list)
    for s in slow:
        by_host[str(s["host"])].append(s["rank"])
    parts = []
    for i, g in enumerate(groups):
        where = f" on {', '.join(g['hosts'][:4])}" if i and 0 < len(g["hosts"]) <= 4 else ""
        parts.append(f"{g['count']} rank{'s' if g['count'] != 1 else ''} {g['kind']}{where}")
    sentence = "; ".join(parts)
    if slow:
        sentence += "; stragglers (the others wait for them): " + "; ".join(
            f"rank{'s' if len(r) > 1 else ''} {_named(sorted(r))} on {h}"
            for h, r in sorted(by_host.items(), key=lambda kv: -len(kv[1])))
    return {"ranks": len(rows), "distributions": dist, "clusters": groups, "stragglers": slow,
            "straggler_hosts": [{"host": h, "ranks": sorted(r)} for h, r in by_host.items()],
            "sentence": sentence,
            "sources": dict(Counter(str(row.get("source")) for row in rows))}


def detail_ranks(job: dict[str, Any] | None) -> set[Any] | None:
    """The ranks whose per-step rows a large capture keeps: the stragglers and the worst rank of
    each distribution; ``None`` (keep all) for a capture of at most ``DETAIL_UP_TO`` ranks."""
    if not job or job["ranks"] <= DETAIL_UP_TO:
        return None
    return ({s["rank"] for s in job["stragglers"]}
            | {d["worst_rank"] for d in job["distributions"].values()})


def keep_detail(rows: list[dict[str, Any]], ranks: set[Any] | None,
                capture: str | None = None) -> list[dict[str, Any]]:
    """``rows`` (per-step rows with ``rank``, and ``capture`` when given) without those of ranks
    outside ``ranks`` (of ``capture`` only, when given)."""
    if ranks is None:
        return rows
    return [r for r in rows if r.get("rank") in ranks
            or (capture is not None and r.get("capture") != capture)]
