"""Whether the captured steps stand for the run: most of its steps far slower than they were."""

from __future__ import annotations

from typing import Any

from profcallbacks.core.timing import median
from profcallbacks.report.analyse.captures import UNHEALTHY_TRIGGERS
from profcallbacks.report.analyse.fmt import ms

FAR_SLOWER = 3.0
"""Steps at least this many times the captured steps' time are far slower than them."""


def slower_than_captured(captures: list[dict[str, Any]],
                         intervals: list[dict[str, Any]]) -> dict[str, Any] | None:
    """``{"message", "captured_step_ms", "slow_steps", "steps", "ratio_low", "ratio_high"}``
    when most of the run's steps (steps-file intervals by their median) took at least
    :data:`FAR_SLOWER` x the step time of the captures the verdict is read from; else ``None``.

    Example:
        >>> captures = [{"trigger": "schedule", "metrics": {"step_ms": 30.0}}]
        >>> rows = [{"steps": 50, "step_time_ms_median": 30.0},
        ...         {"steps": 150, "step_time_ms_median": 370.0}]
        >>> slower_than_captured(captures, rows)["slow_steps"]
        150
    """
    chosen = [c for c in captures if c.get("trigger") not in UNHEALTHY_TRIGGERS
              and (c.get("metrics") or {}).get("step_ms")] or \
        [c for c in captures if (c.get("metrics") or {}).get("step_ms")]
    total = sum(int(r["steps"]) for r in intervals)
    if not chosen or total <= 0:
        return None
    captured = median([float(c["metrics"]["step_ms"]) for c in chosen])
    slow = [r for r in intervals if r["step_time_ms_median"] >= FAR_SLOWER * captured]
    slow_steps = sum(int(r["steps"]) for r in slow)
    if captured <= 0 or 2 * slow_steps <= total:
        return None
    ratios = [r["step_time_ms_median"] / captured for r in slow]
    low, high = min(ratios), max(ratios)
    spread = f"{low:.0f}x" if round(low) == round(high) else f"{low:.0f}-{high:.0f}x"
    message = (f"most of the run's steps were far slower than the captured ones: {slow_steps} of "
               f"{total} steps at {spread} the captured steps' {ms(captured)}; this verdict "
               "describes the captured steps only")
    return {"message": message, "captured_step_ms": round(captured, 3), "slow_steps": slow_steps,
            "steps": total, "ratio_low": round(low, 2), "ratio_high": round(high, 2)}
