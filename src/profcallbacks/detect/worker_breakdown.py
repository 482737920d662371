"""Where a loader's workers spend each batch, and what an expert would change: pure arithmetic.

:func:`summarise` turns timed batches (:class:`BatchTimes`) and the training loop's waits into a
:class:`WorkersBreakdown`: per worker the mean fetch, collate, send and transfer time of a
batch, the batches it builds per second, and the sampler's hot lines. :func:`verdict` weighs that
against what the steps consume and names the largest part and the fix that fits it, with the
gain computed as the report's step model does (``report.analyse.diagnoses.whatif.loader_saving``:
with ``W`` workers a batch is ready every ``batch_ms * batches_per_step / W``; what the rest of
the step does not hide of that is left).

Example:
    >>> b = [BatchTimes(1, 0, i, i % 2, i * 0.01, i * 0.01 + 0.009, i * 0.01 + 0.0095,
    ...                 i * 0.01 + 0.0096, i * 0.01 + 0.0096, i * 0.01 + 0.0097) for i in range(8)]
    >>> s = summarise(b, {}, workers=2)
    >>> s.largest, round(s.rows[0].fetch_ms, 1)
    ('fetch', 9.0)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from profcallbacks.core.cpus import loader_workers
from profcallbacks.detect.worker_sampler import hot_lines

PARTS = ("fetch", "collate", "transfer", "pin")
"""The parts of a batch's time a worker (and the main process, for transfer and pinning) spends
(``pin`` only with ``pin_memory=True``, where a thread of the main process pins each batch)."""
HEADROOM = 1.2
"""Workers that would keep up build this many times what the steps consume: a loader that builds
just as fast as the steps consume leaves every jitter of a worker as a wait."""
STARTUP = "start-up"
TOO_FEW = "too few workers"


class BatchTimes(NamedTuple):
    """One timed batch (``perf_counter`` seconds): its set of workers, the pass over that set,
    its index in the pass, the worker, and when its fetch, collate, put and send began/ended."""

    set: int
    pass_: int
    idx: int
    worker: int
    get: float
    collate0: float
    collate1: float
    put: float
    send0: float
    send1: float


class WaitTimes(NamedTuple):
    """The training loop's wait for one batch (``perf_counter`` seconds), by the batch's key."""

    set: int
    pass_: int
    idx: int
    start: float
    end: float


@dataclass(frozen=True)
class WorkerRow:
    """One worker's mean batch, in milliseconds (``per_s``: batches it builds per second)."""

    worker: int
    batches: int
    fetch_ms: float
    collate_ms: float
    send_ms: float
    transfer_ms: float
    busy_ms: float
    per_s: float
    pin_ms: float = 0.0


@dataclass(frozen=True)
class WorkersBreakdown:
    """The recent batches of a loader's workers, summed up (see :func:`summarise`)."""

    workers: int
    rows: list[WorkerRow]
    parts_ms: dict[str, float]
    largest: str
    batches_per_step: float
    startup_ms: float | None = None
    lines: list[tuple[str, str, float]] = field(default_factory=list)

    @property
    def batch_ms(self) -> float:
        """A worker's mean time per batch (fetch + collate + send), ms."""
        n = sum(r.batches for r in self.rows)
        return sum(r.busy_ms * r.batches for r in self.rows) / n if n else 0.0

    @property
    def per_s(self) -> float:
        """Batches per second all workers build together."""
        return sum(r.per_s for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["lines"] = [{"line": line, "phase": phase, "share": round(share, 3)}
                        for line, phase, share in self.lines]
        out["rows"] = [{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}
                       for r in out["rows"]]
        out["parts_ms"] = {k: round(v, 3) for k, v in self.parts_ms.items()}
        return out


def summarise(batches: list[BatchTimes], waits: dict[tuple[int, int, int], tuple[float, float, int]],
              *, workers: int, hot: list[dict[str, Any]] = (),  # type: ignore[assignment]
              startup: list[tuple[float, float]] | None = None,
              pins: dict[tuple[int, int, int], tuple[float, float]] | None = None,
              ) -> WorkersBreakdown | None:
    """Sum ``batches`` up per worker; ``waits`` (the loop's wait per batch key, with its step)
    give the main process's part of the transfer and the batches per step, ``pins`` (the pin
    thread's time per batch key) the pinning, taken out of that transfer."""
    whole = [b for b in batches if b.send1 > 0 and b.put >= b.get > 0]
    if not whole:
        return None
    pins = pins or {}
    per: dict[int, list[tuple[float, float, float, float, float]]] = {}
    for b in whole:
        key = (b.set, b.pass_, b.idx)
        got, pin = waits.get(key), pins.get(key)
        main = 0.0
        if got is not None:  # the loop's wait after the send: what the pinning leaves of it
            begin = max(got[0], b.send1)
            main = max(0.0, got[1] - begin)
            if pin is not None:
                main -= max(0.0, min(pin[1], got[1]) - max(pin[0], begin))
        per.setdefault(b.worker, []).append((b.collate0 - b.get, b.collate1 - b.collate0,
                                             b.send1 - b.send0, max(main, 0.0),
                                             pin[1] - pin[0] if pin is not None else 0.0))
    rows = []
    for worker, parts in sorted(per.items()):
        n = len(parts)
        fetch, collate, send, main, pin_ms = (1e3 * sum(p[i] for p in parts) / n for i in range(5))
        busy = fetch + collate + send
        rows.append(WorkerRow(worker, n, fetch, collate, send, main, busy,
                              1e3 / busy if busy > 0 else math.inf, pin_ms))
    n = len(whole)
    parts_ms = {"fetch": sum(r.fetch_ms * r.batches for r in rows) / n,
                "collate": sum(r.collate_ms * r.batches for r in rows) / n,
                "transfer": sum((r.send_ms + r.transfer_ms) * r.batches for r in rows) / n}
    if pins:
        parts_ms["pin"] = sum(r.pin_ms * r.batches for r in rows) / n
    steps = [w[2] for w in waits.values()]
    per_step = len(steps) / len(set(steps)) if steps else 1.0
    start = max((a + b for a, b in startup), default=0.0) * 1e3 if startup else None
    return WorkersBreakdown(workers=workers, rows=rows, parts_ms=parts_ms,
                            largest=max(parts_ms, key=lambda k: parts_ms[k]),
                            batches_per_step=per_step, startup_ms=start,
                            lines=_merged_lines(hot))


def _merged_lines(hot: list[dict[str, Any]]) -> list[tuple[str, str, float]]:
    busy = sum(int(h.get("busy") or 0) for h in hot)
    counts: dict[tuple[str, str], float] = {}
    for h in hot:
        for line, phase, share in hot_lines(h):
            counts[(line, phase)] = counts.get((line, phase), 0.0) + share * int(h.get("busy") or 0)
    rows = [(line, phase, n / busy) for (line, phase), n in counts.items()] if busy else []
    return sorted(rows, key=lambda r: -r[2])[:8]


@dataclass(frozen=True)
class Verdict:
    """What the breakdown means for a stall: the sentence, its fixes and its numbers."""

    text: str
    part: str
    fix: list[str]
    gain_ms: float
    details: dict[str, Any]


def verdict(b: WorkersBreakdown, *, wait_ms: float, step_ms: float,
            info: dict[str, Any]) -> Verdict:
    """Weigh ``b`` against the steps' consumption (``wait_ms`` of ``step_ms`` per step) and the
    loader's settings ``info`` (``describe_loader``'s): the largest part and its fix."""
    rest = max(step_ms - wait_ms, 1e-6)
    needed_per_s = 1e3 * b.batches_per_step / rest
    batch = b.batch_ms
    needed = max(1, math.ceil(HEADROOM * batch * b.batches_per_step / rest)) if batch > 0 else 1
    cpus = int(info.get("cpus") or 1)
    cores = loader_workers(cpus)
    part = b.largest
    share = b.parts_ms[part] / max(sum(b.parts_ms.values()), 1e-9)
    lines = [row for row in b.lines if row[1] == part or part == "transfer"][:3]
    where = "; ".join(f"{line} {s:.0%}" for line, _, s in lines)
    text = (f"the {b.workers} workers build {b.per_s:.1f} batches/s against the "
            f"{needed_per_s:.1f}/s the steps consume ({b.batches_per_step:.3g} per step of "
            f"{rest:.1f} ms without the wait); {needed} workers would keep up with "
            f"{HEADROOM - 1:.0%} to spare"
            + (f" and this process may use {cpus} cores" if needed <= cores else
               f", more than the {cores} this process's {cpus} cores allow") +
            f". Largest part of a worker's batch: {part} ({b.parts_ms[part]:.1f} ms of "
            f"{sum(b.parts_ms.values()):.1f} ms, {share:.0%})"
            + (f" at {where}" if where else ""))
    fix = [_part_fix(part, info)]
    workers_now = max(b.workers, 1)
    if b.workers < needed <= cores:
        fix.insert(0, f"num_workers={needed} ({TOO_FEW}: {b.workers} cannot keep up, "
                      f"{needed} can on {cpus} cores)")
        gain = _saved(wait_ms, rest, batch * b.batches_per_step, needed)
        bottleneck = TOO_FEW
    else:
        cut = batch - min(b.parts_ms[part], batch)
        gain = _saved(wait_ms, rest, max(cut, 0.0) * b.batches_per_step, workers_now)
        bottleneck = part
    if info.get("cuda") and info.get("pin_memory") is False:
        fix.append("pin_memory=True with .to('cuda', non_blocking=True): the copy to the GPU "
                   "overlaps the step")
    details = {"part": part, "bottleneck": bottleneck, "part_share": round(share, 3),
               "workers_needed": needed, "cores": cpus, "consume_per_s": round(needed_per_s, 2),
               "build_per_s": round(b.per_s, 2), "gain_ms": round(gain, 3),
               "workers": b.to_dict()}
    return Verdict(text, part, fix, gain, details)


def _saved(wait_ms: float, rest_ms: float, work_ms: float, workers: int) -> float:
    """What is saved of ``wait_ms`` per step when ``workers`` build a step's batches in
    ``work_ms`` each (``whatif.loader_saving``'s rule)."""
    left = max(work_ms / max(workers, 1) - rest_ms, 0.0)
    return max(wait_ms - left, 0.0)


def _part_fix(part: str, info: dict[str, Any]) -> str:
    at = ""
    if part == "fetch":
        return ("make the dataset's fetch cheaper" + at + ": decode, resize or tokenize once "
                "and cache the decoded samples; move random augmentation to the GPU"
                if info.get("cuda") else "make the dataset's fetch cheaper" + at + ": decode, "
                "resize or tokenize once and cache the decoded samples; avoid per-sample "
                "Python loops")
    if part == "collate":
        return (f"make collate_fn ({info.get('collate_fn')}) cheaper" + at + ": pad or stack "
                "in the dataset, or move per-batch work into the training step")
    if part == "pin":
        return ("pin less per batch: the main process's pin thread copies every tensor of each "
                "batch to pinned memory (fewer, larger tensors; smaller dtypes), or pin_memory=False "
                "where the copy to the GPU does not overlap the step anyway")
    return ("send less back to the main process per batch: fewer, larger tensors (each tensor "
            "is a shared-memory file), smaller dtypes (uint8 images), or a smaller batch_size"
            + at)


def startup_text(startup_ms: float | None, info: dict[str, Any]) -> str:
    """The sentence of a pass's start-up wait, naming the measured start-up."""
    if startup_ms is None:
        return ""
    return (f"; the {info.get('num_workers')} workers took {startup_ms:.0f} ms of {STARTUP} "
            "(process start, dataset copy, worker_init_fn)")
