"""What a capture records: the torch.profiler options, frozen and validated."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import ProfilerActivity

from profcallbacks.options.checks import check_bool, fail

_ACTIVITY_NAMES = {"cpu": ProfilerActivity.CPU, "cuda": ProfilerActivity.CUDA}


@dataclass(frozen=True, kw_only=True)
class TraceOptions:
    """Options passed to ``torch.profiler.profile`` for each capture window.

    Args:
        activities: ``"cpu"`` and/or ``"cuda"``; ``None`` means CPU, plus CUDA when available.
        record_shapes: Record operator input shapes.
        profile_memory: Track tensor allocations (costs more per op).
        with_stack: Record Python/C++ stacks for each op (larger traces).
        with_flops: Estimate FLOPs of matrix ops.
        with_modules: Record the ``nn.Module`` hierarchy of each op.

    Example:
        >>> TraceOptions(with_stack=True).profiler_kwargs()["with_stack"]
        True
    """

    activities: tuple[str, ...] | None = None
    record_shapes: bool = True
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = True

    def __post_init__(self) -> None:
        for name in ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules"):
            check_bool("TraceOptions", name, getattr(self, name))
        activities = self.activities
        if activities is not None:
            if isinstance(activities, str):
                activities = (activities,)
            if (not isinstance(activities, (tuple, list)) or not activities
                    or any(a not in _ACTIVITY_NAMES for a in activities)
                    or len(set(activities)) != len(activities)):
                raise fail("TraceOptions", "activities", self.activities,
                           f"a non-empty tuple of distinct names from {sorted(_ACTIVITY_NAMES)}, or "
                           "None for CPU plus CUDA when available", fix="Use e.g. activities=('cpu',).")
            object.__setattr__(self, "activities", tuple(activities))

    def profiler_activities(self) -> list[ProfilerActivity]:
        if self.activities is None:
            names: tuple[str, ...] = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
        else:
            names = self.activities
        return [_ACTIVITY_NAMES[name] for name in names]

    def profiler_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``torch.profiler.profile``."""
        return {
            "activities": self.profiler_activities(),
            "record_shapes": self.record_shapes,
            "profile_memory": self.profile_memory,
            "with_stack": self.with_stack,
            "with_flops": self.with_flops,
            "with_modules": self.with_modules,
        }
