"""Drop-in profiling callbacks for Lightning, Hugging Face and plain PyTorch training loops."""

from profcallbacks._version import __version__
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

__all__ = [
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
