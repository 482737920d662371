"""``oversubscribed``: intra-op threads that wait for cores other work holds (the machine, not the code).

Recognised from the machine's load while the capture recorded (``core/cpu_load.py``, the trace's
``profcallbacks.cpu`` block), which no trace event shows: over each recorded step's wall time
``W``, the process's CPU time ``C`` and the time ``D`` its threads were runnable but waited for a
core (the scheduler's run delay); CPU pressure and the run queue as the machine's side. The median
step by its wait is read, so a moment of another job's load is not.

Trigger: more than one intra-op thread, on average at least ``RUNNABLE`` threads wanting a core
(``(C + D) / W``: more than the training thread alone), and the threads' wait at least
``WAIT_SHARE`` of the step.

Gain (what one thread saves), from the trace's operators: an operator split over ``n`` threads
ends when the last of them does, so a thread waiting for a core holds up the others (they spin at
the barrier, which is CPU time too: the counters cannot say what was arithmetic). The fastest
instance of each operator (the same call in each step: its name and its place among the
step's operators of that name) is the one no thread waited in: its arithmetic split ``n`` ways. One
thread does it in ``n`` times that and waits for nobody; the time between operators (Python) is
kept as it is. The step after the fix is that sum (``details["step_after_ms"]``, the profiler's
own slowing of a contended step left out); the gain is the step less it, nothing when one thread
would be slower. An operator that does not split is counted as split, so the gain leans low.

Negative cases: the same two threads on a quiet machine (no wait: one thread would be slower); a
single-threaded step on a loaded machine (it waits, but only one thread wants a core).
"""

from __future__ import annotations

import bisect
from typing import Any

from profcallbacks.report.analyse.diagnoses.model import Capture, Diagnosis, Op

RUNNABLE = 1.5
"""Threads wanting a core, on average: more than the training thread alone."""
WAIT_SHARE = 0.2
"""The threads' wait for a core, as a share of the step."""


def oversubscribed(cap: Capture) -> Diagnosis | None:
    """See the module docstring."""
    load = cap.cpu_load or {}
    threads, cores = _number(load.get("threads")), _number(load.get("cpus"))
    rows = cap.load_rows()
    if threads is None or threads < 2 or not rows or not cap.cpu_only:
        return None
    # the median step by its wait: a step another job held up for a moment is not the run
    wall, cpu, delay, pressure = sorted(rows, key=lambda r: r[2] / r[0])[len(rows) // 2]
    if (cpu + delay) / wall < RUNNABLE or delay / wall < WAIT_SHARE:
        return None
    step = cap.step_ms()
    top = _top_ops(cap)
    if step <= 0 or not top:
        return None
    keys = _positions(cap, top)
    fastest: dict[tuple[str, int], float] = {}
    for key, o in zip(keys, top, strict=True):
        fastest[key] = min(fastest.get(key, o.end - o.ts), o.end - o.ts)
    ops_ms = sum(o.end - o.ts for o in top) / 1e3 / cap.n_steps
    alone_ms = sum(threads * fastest[key] for key in keys) / 1e3 / cap.n_steps
    after = max(step - ops_ms, 0.0) + alone_ms
    gain = max(step - after, 0.0)
    share = gain / step
    basis = (f"~{gain:.2f} ms: the step's operators take {ops_ms:.2f} ms, "
             f"{alone_ms:.2f} ms on one thread ({threads:.0f} x each operator's fastest "
             f"instance, the one no thread waited in); the step {step:.2f} -> {after:.2f} ms")
    machine = [f"{threads:.0f} intra-op threads on {cores:.0f} usable cores" if cores else
               f"{threads:.0f} intra-op threads"]
    if _number(pressure) is not None:
        machine.append(f"CPU pressure: some task waited for a core {min(pressure / wall, 1):.0%} "
                       "of the step")
    queue = _number(load.get("run_queue"))
    if queue is not None:
        machine.append(f"run queue {queue:.0f}")
    evidence = [f"the median step: {wall:.2f} ms, the process on a CPU {cpu:.2f} ms and its "
                f"threads waiting for one {delay:.2f} ms ({(cpu + delay) / wall:.1f} threads "
                "wanted a core on average)", "; ".join(machine), basis]
    return Diagnosis(kind="oversubscribed",
                     what="the machine is oversubscribed: the step's threads wait for cores "
                          "other work holds, and each operator waits for its slowest thread",
                     evidence=evidence, where=None, gain_ms=gain, gain_share=share,
                     fix=["torch.set_num_threads(1) (or threads x processes within the cores "
                          "left free), or run on a machine of its own; more threads only make "
                          "it slower."],
                     details={"basis": basis, "threads": int(threads),
                              "run_delay_share": round(delay / wall, 4),
                              "step_after_ms": round(after, 4)})


def _top_ops(cap: Capture) -> list[Op]:
    """The steady part's operators that no other operator encloses."""
    ops = cap.ops
    aten = ops.name_ids(lambda n: n.startswith("aten::"))
    under = {c for c, chain in enumerate(ops.chains) if any(p.startswith("aten::") for p in chain)}
    names, parents = ops.name, ops.parent
    return sorted((ops.op(i) for i in cap.rows_in_steps()
                   if names[i] in aten and parents[i] not in under), key=lambda o: o.ts)


def _positions(cap: Capture, top: list[Op]) -> list[tuple[str, int]]:
    """Each operator's name and its place among the operators of that name in its step: the same
    call in every step (a model's large and small matmuls are both ``aten::mm``)."""
    starts = [s for s, _, _ in cap.steps]
    seen: dict[tuple[int, str], int] = {}
    keys = []
    for o in top:
        step = bisect.bisect_right(starts, o.ts) - 1
        n = seen.get((step, o.name), 0)
        seen[(step, o.name)] = n + 1
        keys.append((o.name, n))
    return keys


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
