"""Drop-in profiling callbacks for Lightning, Hugging Face and plain PyTorch training loops.

The names below are imported on first use, so the command line (``profcallbacks report``,
``watch``) starts without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from profcallbacks._version import __version__

if TYPE_CHECKING:
    from profcallbacks.capture.byte_budget import ByteBudget
    from profcallbacks.capture.options import TraceOptions
    from profcallbacks.capture.schedule import Phase, Schedule
    from profcallbacks.config import ProfilerConfig
    from profcallbacks.core.ranks import RankInfo
    from profcallbacks.core.session import ProfilingSession
    from profcallbacks.detect.memory import MemoryConfig
    from profcallbacks.detect.slowdown import SlowdownConfig
    from profcallbacks.detect.stall import StallConfig
    from profcallbacks.detect.straggler import StragglerConfig
    from profcallbacks.detect.sync_audit import SyncAuditConfig
    from profcallbacks.findings import Finding
    from profcallbacks.loop import StepProfiler

_WHERE = {
    "ByteBudget": "profcallbacks.capture.byte_budget",
    "Finding": "profcallbacks.findings",
    "MemoryConfig": "profcallbacks.detect.memory",
    "Phase": "profcallbacks.capture.schedule",
    "ProfilerConfig": "profcallbacks.config",
    "ProfilingSession": "profcallbacks.core.session",
    "RankInfo": "profcallbacks.core.ranks",
    "Schedule": "profcallbacks.capture.schedule",
    "SlowdownConfig": "profcallbacks.detect.slowdown",
    "StallConfig": "profcallbacks.detect.stall",
    "StepProfiler": "profcallbacks.loop",
    "StragglerConfig": "profcallbacks.detect.straggler",
    "SyncAuditConfig": "profcallbacks.detect.sync_audit",
    "TraceOptions": "profcallbacks.capture.options",
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
