"""``unfused_optimizer`` and ``grad_accumulation_sync``: per-parameter and per-micro-batch overheads.

``unfused_optimizer``. Trigger: inside ``Optimizer.step#...`` ranges, at least ``MIN_OPS`` kernels
(GPU) or operators (CPU) per step, none of them a ``multi_tensor_apply`` kernel, a ``_foreach_``
operator or a fused optimizer kernel, and the optimizer not named fused (``FusedAdam``): the
optimizer loops over parameters, launching a few small
kernels for each. Gain: what a foreach optimizer removes, not the optimizer's time (it does the
same arithmetic): the per-parameter operators it replaces by one multi-tensor call per operator
name. What it removes is the per-parameter loop's host cost: the optimizer's time less the
operators it keeps (step counters) and less the operators' arithmetic (each operator's time beyond
the same operator's on the smaller parameters, its lower quartile: dispatch only; at most to its 9th
decile, as a rare longer instance is a preempted operator), which a multi-tensor call
still does; the multi-tensor calls cost ``whatif.per_op_us`` each (at least the trace's
``whatif.dispatch_floor``). Counting only the operators' dispatch (the
median gap between them) missed the Python between parameters: predicted 1.74 ms where
``foreach=True`` saved 7.26 ms of a 9.1 ms step (benchmarks/calibration.py).
On a GPU the host's saving counts only where the GPU waited for it: at most the GPU idle inside
the optimizer ranges. Few large parameters give few operators and little to save (measured:
``foreach=True`` made a resnet18 SGD step slower).
Negative case: FusedAdam or a foreach optimizer (``multi_tensor_apply_kernel ... AdamFunctor`` on
the memcpy_heavy trace).

``grad_accumulation_sync``. Trigger: a step holding two or more ``DistributedDataParallel.forward``
ranges (micro-batches) with an all-reduce (``nccl:all_reduce``, ``c10d::allreduce_``, or NCCL
all-reduce kernels) after each of the first ones: DDP reduces gradients on every micro-batch, when
only the last one needs it. Cost: the all-reduce time of every micro-batch but the last.
Negative case: one forward per step (the V100 trace), or all-reduce after the last micro-batch only.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Sequence
from itertools import accumulate, islice
from operator import le

from profcallbacks.report.analyse.diagnoses.model import Capture, Diagnosis, Op, ms
from profcallbacks.report.analyse.diagnoses.whatif import busy_of, dispatch_floor, per_op_us
from profcallbacks.report.model.intervals import covered

MIN_OPS = 30
_FUSED = re.compile(r"multi_tensor_apply|_foreach_|fused|Fused|apex", re.IGNORECASE)
_ALLREDUCE = re.compile(r"all_?reduce", re.IGNORECASE)
_KEPT = ("aten::item", "aten::_local_scalar_dense", "aten::empty", "aten::to", "aten::lift_fresh",
         "aten::detach_", "aten::zeros", "aten::copy_", "aten::_to_copy", "aten::is_nonzero")
"""Operators a foreach optimizer still runs once per parameter or per step (its step counters)."""


def _holder(ranges: list[Op]) -> Callable[[Op], bool]:
    """Whether one of ``ranges`` holds an operator: the furthest end among the ranges starting at
    or before it reaches its end (one bisection, not a scan of every range)."""
    ordered = sorted(ranges, key=lambda r: r.ts)
    starts = [r.ts for r in ordered]
    reach = list(accumulate((r.end for r in ordered), max))

    def holds(op: Op) -> bool:
        i = bisect.bisect_right(starts, op.ts)
        return i > 0 and reach[i - 1] >= op.end
    return holds


def unfused_optimizer(cap: Capture) -> Diagnosis | None:
    """See the module docstring."""
    table = cap.ops
    rows = [i for i in table.rows_named(lambda n: n.startswith("Optimizer.step#"))
            if cap.in_steps(table.ts[i])]
    ranges = [table.op(i) for i in rows]
    if not ranges or any(_FUSED.search(r.name) for r in ranges):
        return None
    if not cap.has_gpu and not cap.cpu_only:
        return None  # a device whose kernels this trace does not show (MTIA, a CPU-side file)
    names: list[str] = []
    launched = sorted((k.launch_ts, k.name) for k in cap.kernels
                      if k.cat == "kernel" and k.launch_ts is not None) if cap.has_gpu else []
    starts = [t for t, _ in launched]
    op_starts: Sequence[float] = table.ts  # the table's rows by start (as read, in most traces)
    by_start: Sequence[int] = range(len(table))
    if not all(map(le, op_starts, islice(op_starts, 1, None))):
        by_start = sorted(by_start, key=op_starts.__getitem__)
        op_starts = [op_starts[i] for i in by_start]
    ends, parents, chains, name_of = table.end, table.parent, table.chains, table.name
    for row, r in zip(rows, ranges, strict=True):  # kernels and operators found by bisection
        names += [n for _, n in launched[bisect.bisect_left(starts, r.ts):
                                         bisect.bisect_right(starts, r.end)]]
        names += [table.names[name_of[i]] for i in by_start[bisect.bisect_left(op_starts, r.ts):
                                                            bisect.bisect_right(op_starts, r.end)]
                  if ends[i] <= r.end and chains[parents[i]] and chains[parents[i]][-1] == r.name
                  and i != row]
    if any(_FUSED.search(n) for n in names):
        return None
    counted = [n for n in names if not n.startswith(("aten::", "Optimizer"))] if cap.has_gpu else names
    per_step = len(counted) / cap.n_steps
    if per_step < MIN_OPS:
        return None
    cost = sum(r.end - r.ts for r in ranges)
    holds, range_names = _holder(ranges), {r.name for r in ranges}
    under = {c for c, chain in enumerate(table.chains) if chain and chain[-1] in range_names}
    children = [o for o in map(table.op, (i for i, c in enumerate(table.parent) if c in under))
                if holds(o)]
    per_param = [o for o in children if not o.name.startswith(_KEPT)]
    kept = len({o.name for o in per_param}) * len(ranges)  # one multi-tensor call per name
    each = per_op_us(per_param)
    floor = dispatch_floor(cap)
    by_name: dict[str, list[float]] = {}
    for o in per_param:
        by_name.setdefault(o.name, []).append(o.end - o.ts)
    for d in by_name.values():
        d.sort()
    least = {name: d[len(d) // 4] for name, d in by_name.items()}  # small parameters'
    # a rare longer instance is the machine (an operator preempted by other work), not arithmetic:
    # the excess counts at most to the name's 9th decile
    most = {name: d[len(d) * 9 // 10] - least[name] for name, d in by_name.items()}
    arithmetic = sum(min(max(o.end - o.ts - least[o.name], 0.0), most[o.name]) for o in per_param)
    stays = sum(o.end - o.ts for o in children if o.name.startswith(_KEPT))
    loop = max(cost - stays - arithmetic, 0.0)  # the loop's dispatch and Python, per parameter
    saved = max(loop - kept * max(each, floor), 0.0)
    waited = ""
    if cap.has_gpu:  # the host's saving counts where the GPU waited for it
        busy = busy_of(cap)
        idle = sum(r.end - r.ts - covered(busy, r.ts, r.end) for r in ranges)
        saved = min(saved, idle)
        waited = f", at most the GPU idle inside the optimizer ({ms(idle / cap.n_steps)})"
    gain, share = cap.per_step(min(saved, cost))
    n = cap.n_steps
    basis = (f"~{gain:.2f} ms: the per-parameter loop's host cost, {ms(loop / n)} per step "
             f"({len(per_param) / n:.0f} operators and the Python between them; their "
             f"arithmetic, {ms(arithmetic / n)}, stays), less {kept / n:.0f} multi-tensor calls "
             f"x {max(each, floor):.1f} us{waited}")
    optimizer = ranges[0].name.split("#", 1)[1].rsplit(".", 1)[0]
    what = "kernels" if cap.has_gpu else "operators"
    fused = "fused=True (Adam, AdamW, SGD on CUDA) or " if cap.has_gpu else ""
    return Diagnosis(kind="unfused_optimizer",
                     what=f"the optimizer ({optimizer}) steps parameter by parameter",
                     evidence=[f"{per_step:.0f} {what} per optimizer step, none of them "
                               f"multi-tensor (foreach/fused); optimizer {ms(cost / cap.n_steps)} "
                               "per step", basis],
                     where=ranges[0].name, gain_ms=gain, gain_share=share,
                     details={"basis": basis, "optimizer_ms": round(cost / 1e3 / n, 4)},
                     fix=[f"torch.optim.{optimizer}(params, ..., {fused}foreach=True): one "
                          "kernel for many parameters instead of a few per parameter."])


def grad_accumulation_sync(cap: Capture) -> Diagnosis | None:
    """See the module docstring."""
    forwards = sorted(cap.ops.named(lambda n: n == "DistributedDataParallel.forward"),
                      key=lambda o: o.ts)
    reduces = [(o.ts, o.end) for o in cap.ops.named(
        lambda n: bool(_ALLREDUCE.search(n)) and n.startswith(("nccl:", "c10d::", "record_param_comms")))]
    reduces += [(k.ts, k.end) for k in cap.kernels if k.cat == "kernel" and "nccl" in k.name.lower()
                and _ALLREDUCE.search(k.name)]
    cost, accumulating, synced = 0.0, 0, 0
    for start, end, _ in cap.steps:
        micro = [f for f in forwards if start <= f.ts < end]
        if len(micro) < 2:
            continue
        accumulating += 1
        for this, nxt in zip(micro, micro[1:], strict=False):
            between = [(s, e) for s, e in reduces if this.end <= s < nxt.ts]
            if between:
                synced += 1
                cost += sum(e - s for s, e in between)
    if not synced:
        return None
    gain, share = cap.per_step(cost)
    return Diagnosis(kind="grad_accumulation_sync",
                     what="DDP all-reduces gradients on every micro-batch of gradient accumulation",
                     evidence=[f"{accumulating} step(s) with several micro-batches; {synced} "
                               f"all-reduce(s) before the last micro-batch, {ms(cost)}"],
                     where="DistributedDataParallel.forward", gain_ms=gain, gain_share=share,
                     fix=["Wrap every micro-batch but the last in model.no_sync() (Lightning and "
                          "the HF Trainer do this for their accumulate_grad_batches / "
                          "gradient_accumulation_steps; check a custom loop)."])
