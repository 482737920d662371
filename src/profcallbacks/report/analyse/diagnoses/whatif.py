"""What a fix would save: each diagnosis's gain recomputed as a what-if, not the pattern's own time.

A pattern's own duration is not its gain. The host blocked 16 ms in ``cudaDeviceSynchronize``
while the GPU was 95% busy loses about nothing (the work had to finish anyway); a per-parameter
optimizer loop loses its per-operator dispatch cost, not its arithmetic (a fused one does the
same arithmetic); a loader with workers still takes the part of a batch's build time that the
rest of the step does not cover. The functions here give those savings from the trace, each with
its *basis* in words (``~3.1 ms: 212 ops x 14.6 us dispatch``), and :func:`bound_gains` keeps
independent gains from adding up to more than the step.

- :func:`idle_caused`: the GPU idle a set of host waits causes: from each wait's start to the
  first GPU activity after it returns (the GPU drains its queue while the host waits, then waits
  for the host to launch again), minus the time the GPU was busy meanwhile.
- :func:`gpu_time`: the GPU time of a set of kernels, streams that overlap counted once.
- :func:`per_op_us` and :func:`dispatch_floor`: an operator's host cost without its arithmetic,
  as the trace measures it (what a compiled step or a multi-tensor call still pays per call).
- :func:`bound_by_path`: a fix shortens the step by at most its side's part of the critical path
  (``critical_path.py``): a GPU-side fix (TF32, fused attention, fewer device copies) by the GPU's
  part, a host-side fix (fewer operators, a fused optimizer, loader workers, a caching allocator)
  by the host's (its own time, late launches, data wait).
- :func:`loader_saving`: the data wait that ``workers`` loader processes would still leave:
  each batch takes ``wait`` to build on the training thread, ``workers`` build ``workers`` at a
  time, and the rest of the step (``rest``) hides that much of it.

Example:
    >>> saved, basis = loader_saving(wait_ms=20.0, rest_ms=15.0, workers=2)
    >>> saved, basis.split("; ")[1]
    (20.0, 'with 2 workers a batch is ready every 10.00 ms, within the rest of the step (15.00 ms)')
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import islice
from operator import sub

from profcallbacks.report.analyse.critical_path import CriticalPath
from profcallbacks.report.analyse.diagnoses.model import Capture, Diagnosis, Kernel, Op
from profcallbacks.report.model.intervals import Interval, covered, merge


def gpu_time(kernels: Iterable[Kernel]) -> float:
    """The time (us) ``kernels`` kept the GPU busy: the union of their spans, so kernels of
    several streams that overlap count once (their durations summed would count the overlap on
    each stream).

    Example:
        >>> gpu_time([Kernel(0.0, 10.0, "a", "kernel"), Kernel(5.0, 12.0, "b", "kernel")])
        12.0
    """
    return sum(e - s for s, e in merge((k.ts, k.end) for k in kernels))


MIN_OP_US = 0.5
"""The least an eager operator costs to dispatch (us), whatever the trace says."""


def busy_of(cap: Capture) -> list[Interval]:
    """When the GPU ran anything (kernels, copies, sets), merged."""
    return merge((k.ts, k.end) for k in cap.kernels)


def idle_caused(cap: Capture, waits: Iterable[Interval], busy: list[Interval] | None = None) -> float:
    """GPU idle (us) the host waits ``waits`` cause: each from its start to the first GPU activity
    that starts after it ends, less the GPU's busy time there (see the module docstring)."""
    busy = busy_of(cap) if busy is None else busy
    starts = [s for s, _ in busy]
    windows = []
    for s, e in waits:
        i = bisect.bisect_left(starts, e)
        nxt = starts[i] if i < len(starts) else e
        step_end = next((end for st, end, _ in cap.steps if st <= e <= end), e)
        windows.append((s, max(e, min(nxt, step_end))))
    return sum(end - start - covered(busy, start, end) for start, end in merge(windows))


def per_op_us(siblings: Sequence[Op]) -> float:
    """The host cost (us) of one of ``siblings`` without its arithmetic: the median time from an
    operator's start to the next one's (the dispatcher and the Python between two operators).
    The median leaves out what a few operators on large tensors spend computing, and the long
    gaps where the profiler's Python tracing (``with_stack``) inflates a loop's own code."""
    ordered = sorted(siblings, key=lambda o: o.ts)
    return start_to_start_us([o.ts for o in ordered], [o.end for o in ordered])


def start_to_start_us(starts: Sequence[float], ends: Sequence[float]) -> float:
    """:func:`per_op_us` of operators given as columns in start order (``array('d')`` or lists):
    the median is counted by distinct value, not sorted, so millions of operators take no list."""
    if not starts:
        return 0.0
    counts = Counter(map(sub, islice(starts, 1, None), starts))
    counts[ends[-1] - starts[-1]] += 1
    return max(_median(counts, len(starts)), MIN_OP_US)


def _nth(counts: Counter[float], ranks: Sequence[int]) -> list[float]:
    """The values at sorted positions ``ranks`` (ascending) of the multiset ``counts``."""
    out: list[float] = []
    seen = 0
    want = iter(ranks)
    rank = next(want, None)
    for value in sorted(counts):
        seen += counts[value]
        while rank is not None and rank < seen:
            out.append(value)
            rank = next(want, None)
        if rank is None:
            break
    return out


def _median(counts: Counter[float], n: int) -> float:
    """``statistics.median`` of the ``n`` values counted in ``counts``."""
    if n % 2:
        return _nth(counts, [n // 2])[0]
    low, high = _nth(counts, [n // 2 - 1, n // 2])
    return (low + high) / 2


def dispatch_floor(cap: Capture) -> float:
    """What an operator costs the host without arithmetic (us): the lower quartile of the steps'
    operator durations (views, transposes, tiny tensors: dispatch only), at least ``MIN_OP_US``."""
    ts, end = cap.ops.ts, cap.ops.end
    counts = Counter(d for d in (end[i] - ts[i] for i in cap.rows_in_steps()) if d > 0)
    n = sum(counts.values())
    if not n:
        return MIN_OP_US
    return max(_nth(counts, [n // 4])[0], MIN_OP_US)


def loader_saving(wait_ms: float, rest_ms: float, workers: int) -> tuple[float, str]:
    """``(saved_ms, basis)``: what ``workers`` loader processes save of a ``wait_ms`` data wait per
    step when the rest of the step takes ``rest_ms`` (see the module docstring)."""
    workers = max(workers, 1)
    every = wait_ms / workers
    left = max(every - rest_ms, 0.0)
    saved = max(wait_ms - left, 0.0)
    basis = (f"data wait {wait_ms:.2f} ms per step; with {workers} worker"
             f"{'s' if workers > 1 else ''} a batch is ready every {every:.2f} ms, "
             + (f"within the rest of the step ({rest_ms:.2f} ms)" if left <= 0 else
                f"{left:.2f} ms after the rest of the step ({rest_ms:.2f} ms) ends"))
    return saved, basis


def bound_gains(found: list[Diagnosis], step_ms: float) -> list[Diagnosis]:
    """``found`` (largest gain first) with no gain over what the larger ones leave of the step:
    fixes applied one after another can save at most the whole step. ``cold_start`` is apart: it
    is not steady-state work."""
    left = step_ms
    out = []
    for d in found:
        if d.kind == "cold_start" or step_ms <= 0:
            out.append(d)
            continue
        gain = min(d.gain_ms, max(left, 0.0))
        if gain < d.gain_ms:
            details = dict(d.details, bounded_from_ms=round(d.gain_ms, 4))
            d = Diagnosis(d.kind, d.what, d.evidence, d.where, gain, gain / step_ms, d.fix, details)
        left -= gain
        out.append(d)
    return out


SIDE = {"fp32_compute": "gpu", "attention_math_fallback": "gpu", "hidden_copies": "gpu",
        "dispatch_bound": "host", "launch_bound": "host", "unfused_optimizer": "host",
        "allocator_churn": "host", "input_pipeline": "host"}
"""The side of the step each fix shortens (kinds not named here are bounded otherwise: a sync's
gain is already the GPU idle it causes)."""


def bound_by_path(found: list[Diagnosis], path: CriticalPath | None) -> list[Diagnosis]:
    """``found`` with each gain at most its side's part of the critical path ``path`` (per step,
    ms), and ``details["shortens"]`` naming that side; unchanged without a path (CPU runs)."""
    if path is None or path.steps == 0:
        return found
    parts = {"gpu": path.gpu_ms, "host": path.host_ms + path.launch_ms + path.data_ms}
    out = []
    for d in found:
        side = SIDE.get(d.kind)
        if side is None:
            out.append(d)
            continue
        limit = parts[side]
        details = dict(d.details, shortens=side, critical_ms=round(limit, 4))
        gain, share, evidence = d.gain_ms, d.gain_share, d.evidence
        if gain > limit:
            details["path_bounded_from_ms"] = round(gain, 4)
            share = share * limit / gain if gain > 0 else 0.0
            gain = limit
            who = "GPU" if side == "gpu" else "host"
            line = (f"at most ~{gain:.2f} ms now: the {who} holds only {limit:.2f} ms of the "
                    f"step's critical path ({path.sentence()})" if limit > 0 else
                    f"nothing now: the {who} is off the step's critical path ({path.sentence()}); "
                    f"it pays once the other side is fixed")
            evidence = [*evidence, line]
            details["basis"] = f"{details['basis']}; {line}" if details.get("basis") else line
        out.append(Diagnosis(d.kind, d.what, evidence, d.where, gain, share, d.fix, details))
    return out
