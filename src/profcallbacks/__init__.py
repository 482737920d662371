"""Drop-in profiling callbacks for Lightning, Hugging Face and plain PyTorch training loops.

The names below are imported on first use, so the command line (``profcallbacks report``,
``watch``) starts without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from profcallbacks._version import __version__

if TYPE_CHECKING:
    from profcallbacks.core.ranks import RankInfo
    from profcallbacks.findings import Finding
    from profcallbacks.loop import StepProfiler
    from profcallbacks.options.budget import ByteBudget
    from profcallbacks.options.memory import MemoryConfig
    from profcallbacks.options.profiler import ProfilerConfig
    from profcallbacks.options.schedule import Phase, Schedule
    from profcallbacks.options.slowdown import SlowdownConfig
    from profcallbacks.options.stall import StallConfig
    from profcallbacks.options.straggler import StragglerConfig
    from profcallbacks.options.sync_audit import SyncAuditConfig
    from profcallbacks.options.trace import TraceOptions
    from profcallbacks.run.session import ProfilingSession

_WHERE = {
    "ByteBudget": "profcallbacks.options.budget",
    "Finding": "profcallbacks.findings",
    "MemoryConfig": "profcallbacks.options.memory",
    "Phase": "profcallbacks.options.schedule",
    "ProfilerConfig": "profcallbacks.options.profiler",
    "ProfilingSession": "profcallbacks.run.session",
    "RankInfo": "profcallbacks.core.ranks",
    "Schedule": "profcallbacks.options.schedule",
    "SlowdownConfig": "profcallbacks.options.slowdown",
    "StallConfig": "profcallbacks.options.stall",
    "StepProfiler": "profcallbacks.loop",
    "StragglerConfig": "profcallbacks.options.straggler",
    "SyncAuditConfig": "profcallbacks.options.sync_audit",
    "TraceOptions": "profcallbacks.options.trace",
}

__all__ = [
    "ByteBudget",
    "Finding",
    "MemoryConfig",
    "Phase",
    "ProfilerConfig",
    "ProfilingSession",
    "RankInfo",
    "Schedule",
    "SlowdownConfig",
    "StallConfig",
    "StepProfiler",
    "StragglerConfig",
    "SyncAuditConfig",
    "TraceOptions",
    "__version__",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'profcallbacks' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # imported once
    return value


def __dir__() -> list[str]:
    return __all__
