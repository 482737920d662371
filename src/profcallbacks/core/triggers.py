"""Why a capture window opens: the trigger names, and the request a detector makes for a capture.

A trigger names a capture's directory (``step000120-slowdown``) and is written into its trace, so
the readers (``profcallbacks report``, the live analysis) tell healthy captures from the others.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULE = "schedule"
"""A window of ``ProfilerConfig.schedule``."""
MANUAL = "manual"
"""``capture()`` on a front end, or ``ProfilingSession.request_capture()``."""
FILE = "file"
"""A ``CAPTURE`` file in the log directory."""
SLOWDOWN = "slowdown"
"""A slowdown alert: the slow steps."""
BASELINE = "baseline"
"""Healthy steps right after the slowdown detector's warm-up, to compare a slowdown capture with."""
MEMORY = "memory"
"""A ``memory_creep`` alert: the steps whose allocations are followed."""
VALIDATION = "validation"
"""A validation/evaluation run between training steps."""

TRIGGERS = (SCHEDULE, MANUAL, FILE, SLOWDOWN, BASELINE, MEMORY, VALIDATION)
UNHEALTHY_TRIGGERS = frozenset({SLOWDOWN, MEMORY, VALIDATION})
"""Captures that are not ordinary training steps: taken because steps were slow, under the memory
spy (``profile_memory`` plus a dispatch mode), or of a whole evaluation; left out of the run's
verdict and mean breakdown, and never the "before" of a slowdown diagnosis."""


@dataclass(frozen=True)
class CaptureRequest:
    """A capture asked for outside the schedule, with what the capture needs.

    Args:
        trigger: Why (one of :data:`TRIGGERS`): names the capture directory.
        steps: Recorded steps (``None``: ``ProfilerConfig.capture_steps``).
        profile_memory: The trace records allocations too (the plugin's Memory view), whatever
            ``TraceOptions.profile_memory`` says.

    Example:
        >>> CaptureRequest(MEMORY, profile_memory=True)
        CaptureRequest(trigger='memory', steps=None, profile_memory=True)
    """

    trigger: str
    steps: int | None = None
    profile_memory: bool = False
