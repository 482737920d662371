"""Drop-in profiling callbacks for Lightning, Hugging Face and plain PyTorch training loops."""

from profcallbacks._version import __version__
from profcallbacks.config import ProfilerConfig
from profcallbacks.detectors.slowdown import SlowdownConfig
from profcallbacks.detectors.stall import StallConfig
from profcallbacks.detectors.straggler import StragglerConfig
from profcallbacks.findings import Finding
from profcallbacks.options import TraceOptions
from profcallbacks.ranks import RankInfo
from profcallbacks.schedule import Phase, Schedule
from profcallbacks.session import ProfilingSession
from profcallbacks.step_profiler import StepProfiler
from profcallbacks.syncpoints import SyncAuditConfig

__all__ = [
    "Finding",
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
