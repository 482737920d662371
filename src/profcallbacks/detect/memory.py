"""Memory numbers read off the hot path, and the ``memory_creep`` detector over them.

The numbers are read where step summaries are published (once per ``log_every_n_steps`` steps and
at most once per ``MemoryConfig.sample_every_s`` seconds), never per step. None of the reads
synchronises with a device: on CUDA they ask the caching allocator, on CPU ``/proc/self/statm``.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from typing import Any

from profcallbacks.core.timing import median
from profcallbacks.core.triggers import MEMORY, CaptureRequest
from profcallbacks.findings import MEMORY_CREEP, Finding
from profcallbacks.options.memory import SEGMENTS as _SEGMENTS
from profcallbacks.options.memory import MemoryConfig

__all__ = ["CUDA_ALLOCATED", "PROCESS_RSS", "MemoryCreepDetector", "cuda_total_mb", "read_cuda_mb",
           "read_rss_mb", "theil_sen"]

log = logging.getLogger(__name__)

MB = 1024 * 1024
CUDA_ALLOCATED = "cuda_allocated"
PROCESS_RSS = "process_rss"
MAX_SAMPLES = 512  # samples kept: a window of 30 s sampled every 0.2 s holds 150


def read_rss_mb() -> float | None:
    """Resident memory of this process in MB (Linux ``/proc/self/statm``), else ``None``."""
    try:
        with open("/proc/self/statm", "rb") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / MB


def read_cuda_mb() -> dict[str, float]:
    """Allocated, reserved and peak-since-last-call MB on the current CUDA device; none syncs.

    Empty when CUDA is unavailable or not initialised (reading must not initialise it).
    """
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {}
    values = {"memory_allocated_mb": torch.cuda.memory_allocated() / MB,
              "memory_reserved_mb": torch.cuda.memory_reserved() / MB,
              "memory_peak_mb": torch.cuda.max_memory_allocated() / MB}
    torch.cuda.reset_peak_memory_stats()
    return values


def cuda_total_mb() -> float | None:
    """Capacity of the current CUDA device in MB (``None`` without CUDA)."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / MB


def theil_sen(points: list[tuple[int, float]]) -> float:
    """Median of the slopes between every two points (value per step); robust to outliers."""
    slopes = [(b[1] - a[1]) / (b[0] - a[0]) for i, a in enumerate(points)
              for b in points[i + 1:] if b[0] != a[0]]
    return median(slopes) if slopes else 0.0


class MemoryCreepDetector:
    """Raises one ``memory_creep`` finding per episode of sustained memory growth.

    Fed one sample per step summary (``observe(step, mb, now)``), never per step. An episode
    ends when the slope falls below half of ``min_rate_mb_per_1k_steps``; the next growth alerts
    again. Without ``now`` (seconds, any clock) the window is sized in steps and samples only.

    Example:
        >>> detector = MemoryCreepDetector(MemoryConfig(warmup_steps=0, window_steps=100), rank=0)
        >>> [f.kind for s in range(0, 100, 10) for f in detector.observe(s, 100.0 + s)]
        ['memory_creep']
    """

    def __init__(self, config: MemoryConfig, *, rank: int, source: str = PROCESS_RSS,
                 total_mb: float | None = None) -> None:
        self.config = config
        self.rank = rank
        self.source = source
        self.total_mb = total_mb
        self.samples: deque[tuple[int, float]] = deque(maxlen=MAX_SAMPLES)
        self._times: deque[float | None] = deque(maxlen=MAX_SAMPLES)  # seconds of each sample
        self._alerted = False

    def observe(self, step: int, mb: float, now: float | None = None) -> list[Finding]:
        """Take the sample of ``step`` (``mb`` of the source, read at ``now`` seconds); returns
        the finding, if any."""
        if step < self.config.warmup_steps:
            return []
        self.samples.append((step, mb))
        self._times.append(now)
        window = self._window(step, now)
        if window is None:
            return []
        rate = theil_sen(_thin(window, 32))  # 496 pairs: about 0.1 ms
        limit = self.config.min_rate_mb_per_1k_steps / 1000
        if rate < limit / 2:
            self._alerted = False
            return []
        if self._alerted or rate < limit or not self._sustained(window, rate):
            return []
        self._alerted = True
        return [self._finding(step, mb, rate)]

    def _window(self, step: int, now: float | None) -> list[tuple[int, float]] | None:
        """The samples to judge (see :class:`MemoryConfig`), or ``None`` before any judgement."""
        config = self.config
        samples, times = self.samples, self._times
        start = len(samples) - min(config.min_samples, len(samples))  # at least min_samples
        while start > 0 and (samples[start - 1][0] > step - config.window_steps or (
                now is not None and (t := times[start - 1]) is not None
                and t > now - config.window_s)):
            start -= 1
        window = list(samples)[start:]
        if len(window) < config.min_samples:
            return None
        first_time = times[start]
        long_in_steps = window[-1][0] - window[0][0] >= config.window_steps // 2
        long_in_time = now is not None and first_time is not None and \
            now - first_time >= config.window_s / 2
        return window if long_in_steps or long_in_time else None

    def _sustained(self, window: list[tuple[int, float]], rate: float) -> bool:
        span = window[-1][0] - window[0][0]
        if rate * span < self.config.min_growth_mb:
            return False
        size = len(window) / _SEGMENTS
        parts = [window[round(i * size):round((i + 1) * size)] for i in range(_SEGMENTS)]
        centres = [(median(s for s, _ in p), median(v for _, v in p)) for p in parts]
        return all(b[1] - a[1] >= 0.25 * rate * (b[0] - a[0])
                   for a, b in zip(centres, centres[1:], strict=False))

    def _finding(self, step: int, mb: float, rate: float) -> Finding:
        first = min(self.samples, key=lambda sample: sample[1])[0]
        per_1k = rate * 1000
        details: dict[str, Any] = {
            "growth_mb_per_1k_steps": round(per_1k, 1), "source": self.source,
            "first_step": first, "current_mb": round(mb, 1),
            "projected_mb_in_10k_steps": round(mb + per_1k * 10, 1)}
        message = (f"memory ({self.source}) grows {per_1k:,.0f} MB per 1,000 steps since step "
                   f"{first} or earlier: {mb:,.0f} MB now, {mb + per_1k * 10:,.0f} MB in 10,000 steps")
        if self.total_mb is not None:
            full = step + int(max(self.total_mb - mb, 0.0) / rate)
            details.update(device_total_mb=round(self.total_mb, 1), full_at_step=full)
            message += f"; at this rate the device is full at step {full:,}"
        if self.config.capture_sites:
            message += "; a short memory capture looks for the lines that keep it"
        return Finding(MEMORY_CREEP, step, self.rank, "warning", message + ".", details,
                       capture=(CaptureRequest(MEMORY, profile_memory=True)
                                if self.config.capture_sites else None))


def _thin(points: list[tuple[int, float]], most: int) -> list[tuple[int, float]]:
    """At most ``most`` points spread evenly over ``points`` (keeps Theil-Sen cheap)."""
    if len(points) <= most:
        return points
    stride = len(points) / most
    return [points[int(i * stride)] for i in range(most)]
