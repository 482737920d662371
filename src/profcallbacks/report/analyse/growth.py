"""Machine or code: whether a slowdown stretched the whole step alike or grew a few parts of it.

When a co-tenant process, thermal throttling or a noisy neighbour takes the machine's cores, the
whole step stretches: the process waits for a core wherever it happens to be, so data wait, CPU
operators and the time between them all grow by about the step's own factor, and the step keeps
its shape. When the code or the data changed (more matrix multiplications, a slower loader, a
new sync), a few parts grow and the step changes shape. Two captures' per-step numbers tell them
apart:

- ``parts``: data wait, CPU operators and the rest of the step (ms per step);
- ``factor``: the step's growth; each part that held ``MAJOR_PART`` of the step or more before
  has its own growth factor;
- ``shift``: how much of the step moved between parts (half the summed share changes, 0-1);
- ``op_shift``: the largest rise of one operator's (or kernel's) share of the step.

Where both captures carry the process's CPU counters (``core/cpu_load.py``: per step its CPU
time and the time its threads were runnable but waited for a core), they decide first: the growth
is ``uniform`` when waiting for a core took ``WAIT_SHARE`` or more of the time the step grew while
the CPU work per step grew by at most ``MAX_WORK_FACTOR``. The shape cannot say so: each of the
neighbours' turns lands on whichever operator runs, and on a core shared with five spinning
processes one large operator took 0.2-0.5 more of the step in half of ten 6-step captures
(aten::mm, the most time of the step's operators) while the process's CPU time per step stayed
put.

Otherwise the growth is ``uniform`` when the step grew by ``MIN_FACTOR`` or more, the CPU operators
(at least ``MIN_OPS_PART`` of the step) and the data wait, when it is a major part, grew within
``UNIFORM_BAND`` times of the step's factor and ``op_shift`` stays within
``UNIFORM_OP_SHIFT``; ``concentrated`` otherwise, naming the parts and operators whose share of
the step rose most. (Shares alone do not tell: a loader that took 70% of the step and gets 5x
slower moves only 15% of the step, yet the operators did not slow at all.) The rest of the step
(Python between operators, waits) is not judged: on a loaded machine it wanders most.

Example:
    >>> before = {"data wait": 4.0, "CPU operators": 4.0, "other": 2.0}
    >>> ops = {"aten::mm": 2.0, "aten::add": 1.0}
    >>> growth_pattern(before, {k: 5 * v for k, v in before.items()}, ops,
    ...                {k: 5 * v for k, v in ops.items()})["pattern"]
    'uniform'
    >>> growth_pattern(before, {"data wait": 4.0, "CPU operators": 40.0, "other": 2.0}, ops,
    ...                {"aten::mm": 38.0, "aten::add": 1.0})["concentrated_in"]
    ['aten::mm']
"""

from __future__ import annotations

from typing import Any, NamedTuple


class CpuPerStep(NamedTuple):
    """The process's CPU counters over a capture, per step (``core/cpu_load.py``)."""

    cpu_ms: float  # on-CPU time of its threads
    wait_ms: float  # time its threads were runnable but waited for a core


MIN_FACTOR = 1.3
MAJOR_PART = 0.25
"""Parts that held this share of the step before must have grown with it (smaller parts of a
short capture are too noisy on a time-sliced core to judge)."""
MIN_OPS_PART = 0.1
"""The CPU operators must hold this share of the step, and have grown with it: a step that is
nearly all data wait cannot tell a slow machine from a slow loader."""
UNIFORM_BAND = 1.5
"""Most a major part's growth factor may differ (either way) from the step's in a uniform
slowdown: with a co-tenant on the training's core the parts grew 3.5-5x for a 4-5x step in
tests; a slower loader grew 5x beside operators that grew 1-2x."""
UNIFORM_OP_SHIFT = 0.2
"""Largest rise of one operator's share of the step in a uniform slowdown."""
WAIT_SHARE = 0.5
"""Share of the step's growth its threads spent waiting for a core, at least, for the machine."""
MAX_WORK_FACTOR = 1.5
"""Most the process's CPU work per step may grow for the machine: a step that does more work on
a loaded machine also waits more, in proportion (extra matrix multiplications beside two
CPU-burning processes on two cores: 6.7-9.3x the CPU work, and 81-98% of the growth waiting in
some runs), while a neighbour arriving leaves the work put (0.83-0.95x in three runs)."""


def _shares(parts: dict[str, float]) -> dict[str, float]:
    total = sum(max(v, 0.0) for v in parts.values())
    return {k: max(v, 0.0) / total for k, v in parts.items()} if total > 0 else {}


def growth_pattern(before: dict[str, float], after: dict[str, float],
                   before_ops: dict[str, float], after_ops: dict[str, float],
                   before_cpu: CpuPerStep | None = None,
                   after_cpu: CpuPerStep | None = None) -> dict[str, Any]:
    """How the step grew from ``before`` to ``after``.

    Args:
        before, after: The step's parts (ms per step) that add up to it: ``data wait``,
            ``CPU operators``, ``other``.
        before_ops, after_ops: Operators' and kernels' self times (ms per step).
        before_cpu, after_cpu: The process's CPU time and its threads' wait for a core (ms per
            step), where the captures carry them.

    Returns:
        ``{"pattern", "factor", "shift", "part_factors", "op_shift", "concentrated_in",
        "core_wait", "work_factor"}``: ``pattern`` is
        ``uniform``, ``concentrated`` or ``none`` (the step did not grow by ``MIN_FACTOR``);
        ``factor`` the step's growth; ``concentrated_in`` the parts or operators whose share of
        the step rose most (at most 3), largest first; ``core_wait`` the share of the step's
        growth spent waiting for a core and ``work_factor`` the growth of the CPU work per step
        (``None`` without the counters).

    Example:
        >>> parts = {"data wait": 0.0, "CPU operators": 10.0, "other": 2.0}
        >>> slow = {"data wait": 0.0, "CPU operators": 60.0, "other": 12.0}
        >>> ops, taken = {"aten::mm": 5.0, "aten::add": 5.0}, {"aten::mm": 50.0, "aten::add": 10.0}
        >>> growth_pattern(parts, slow, ops, taken)["pattern"]  # the shape alone: aten::mm
        'concentrated'
        >>> growth_pattern(parts, slow, ops, taken, CpuPerStep(12.0, 0.5),
        ...                CpuPerStep(13.0, 59.0))["pattern"]  # it waited for a core
        'uniform'
        >>> growth_pattern(parts, slow, ops, taken, CpuPerStep(12.0, 0.5),
        ...                CpuPerStep(40.0, 32.0))["pattern"]  # more work, and waits with it
        'concentrated'
        >>> growth_pattern(parts, slow, ops, taken, CpuPerStep(2.0, 2.0),
        ...                CpuPerStep(16.0, 60.0))["pattern"]  # 8x the work, mostly waiting
        'concentrated'
    """
    step_b, step_a = sum(before.values()), sum(after.values())
    factor = step_a / step_b if step_b > 0 else 0.0
    sb, sa = _shares(before), _shares(after)
    shift = sum(abs(sa.get(k, 0.0) - sb.get(k, 0.0)) for k in set(sb) | set(sa)) / 2
    rises = {k: sa.get(k, 0.0) - sb.get(k, 0.0) for k in sa}
    op_rises = {n: (after_ops.get(n, 0.0) / step_a if step_a else 0.0)
                - (before_ops.get(n, 0.0) / step_b if step_b else 0.0)
                for n in set(before_ops) | set(after_ops)}
    op_shift = max(op_rises.values(), default=0.0)
    ops_b = before.get("CPU operators", 0.0)
    part_factors = {k: after.get(k, 0.0) / v for k, v in before.items()
                    if step_b > 0 and v >= MAJOR_PART * step_b and k != "other"}
    if step_b > 0 and ops_b >= MIN_OPS_PART * step_b:  # the operators must have stretched too
        part_factors["CPU operators"] = after.get("CPU operators", 0.0) / ops_b
    alike = "CPU operators" in part_factors and all(
        factor / UNIFORM_BAND <= f <= factor * UNIFORM_BAND for f in part_factors.values())
    core_wait = _core_wait(before_cpu, after_cpu, step_a - step_b)
    if factor < MIN_FACTOR:
        pattern = "none"
    elif core_wait is not None and core_wait[0] >= WAIT_SHARE and core_wait[1] <= MAX_WORK_FACTOR:
        pattern = "uniform"
    elif alike and op_shift <= UNIFORM_OP_SHIFT:
        pattern = "uniform"
    else:
        pattern = "concentrated"
    named = {**{k: v for k, v in rises.items() if k != "CPU operators"}, **op_rises}
    top = [k for k, v in sorted(named.items(), key=lambda kv: -kv[1]) if v >= 0.05][:3]
    return {"pattern": pattern, "factor": round(factor, 3), "shift": round(shift, 3),
            "part_factors": {k: round(v, 3) for k, v in part_factors.items()},
            "op_shift": round(op_shift, 3),
            "concentrated_in": top if pattern == "concentrated" else [],
            "core_wait": None if core_wait is None else round(core_wait[0], 3),
            "work_factor": None if core_wait is None else round(core_wait[1], 3)}


def _core_wait(before: CpuPerStep | None, after: CpuPerStep | None,
               grew_ms: float) -> tuple[float, float] | None:
    """The share of the step's growth ``grew_ms`` that was waiting for a core, and the growth
    factor of the CPU work per step."""
    if before is None or after is None or grew_ms <= 0 or before.cpu_ms <= 0:
        return None
    return (after.wait_ms - before.wait_ms) / grew_ms, after.cpu_ms / before.cpu_ms


def describe(growth: dict[str, Any]) -> str:
    """One clause for the diagnosis message ('' when there is nothing to say)."""
    if growth["pattern"] == "uniform" and growth.get("core_wait") is not None and (
            growth["core_wait"] >= WAIT_SHARE):
        return (f"the whole step slowed uniformly ({growth['factor']:.1f}x, "
                f"{min(growth['core_wait'], 1.0):.0%} of the growth waiting for a core, the CPU "
                f"work per step {growth['work_factor']:.2f}x): the machine (contention, a noisy "
                "neighbour), not your code")
    if growth["pattern"] == "uniform":
        return (f"the whole step slowed uniformly ({growth['factor']:.1f}x, its parts in the same "
                "proportions): the machine (contention, throttling, a noisy neighbour), not your code")
    if growth["pattern"] == "concentrated" and growth["concentrated_in"]:
        return ("the growth is concentrated in " + ", ".join(growth["concentrated_in"])
                + ": look at what changed there")
    return ""
