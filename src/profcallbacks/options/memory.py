"""Options of the memory numbers and the ``memory_creep`` alert."""

from __future__ import annotations

from dataclasses import dataclass

from profcallbacks.options.checks import check_bool, check_int, check_number

SEGMENTS = 4
"""Growth must show in each of this many consecutive parts of the window."""


@dataclass(frozen=True, kw_only=True)
class MemoryConfig:
    """Always-on memory numbers and the ``memory_creep`` alert (defaults in the README).

    Growth is judged on ``cuda_allocated`` (CUDA) or ``process_rss`` (CPU) after
    ``warmup_steps``, over a window sized in steps, seconds and samples at once: the last
    ``window_steps`` steps or the last ``window_s`` seconds, whichever holds more, and never fewer
    than ``min_samples`` samples. So a loop of 0.1 ms steps sampled once a second is judged over
    seconds (1,000 steps would hold no two samples), one of 5 s steps over steps. The Theil-Sen
    slope (median of pairwise slopes) must reach ``min_rate_mb_per_1k_steps`` and the median of
    each quarter of the window must lie above the one before by a quarter of what that slope
    predicts. Warm-up growth, a one-off jump (the first evaluation) and an allocator that grows
    its cache in steps fail one of the two. With the defaults a leak of 256 KB per step is
    flagged within 2,000 steps or 60 s, whichever is longer, at step times of 0.1 ms to 5 s.

    Args:
        sample_every_s: Least seconds between two samples (0: at every step summary).
        warmup_steps: Samples before this step are ignored (caches filling, first batches).
        window_steps: Steps the growth is judged over (at least); it is judged once samples span
            half of it, or half of ``window_s``.
        window_s: Seconds the growth is judged over (at least), for loops of short steps.
        min_samples: Fewest samples in the window: it reaches back further until it holds
            them, and nothing is judged before.
        min_rate_mb_per_1k_steps: Least sustained growth (MB per 1,000 steps) that alerts.
        min_growth_mb: Least growth (MB) over the judged span that alerts.
        capture_sites: On an alert, capture a few steps and report which lines keep the memory.
        hold_steps: Allocations of the captured steps still alive this many steps after the
            capture count as kept.
        max_sites: Sites reported (largest first).

    Example:
        >>> MemoryConfig(window_steps=500).window_steps
        500
    """

    sample_every_s: float = 1.0
    warmup_steps: int = 200
    window_steps: int = 1000
    window_s: float = 30.0
    min_samples: int = 8
    min_rate_mb_per_1k_steps: float = 32.0
    min_growth_mb: float = 32.0
    capture_sites: bool = True
    hold_steps: int = 5
    max_sites: int = 10

    def __post_init__(self) -> None:
        owner = "MemoryConfig"
        check_number(owner, "sample_every_s", self.sample_every_s, minimum=0.0, maximum=3600.0,
                     example=1.0)
        check_int(owner, "warmup_steps", self.warmup_steps, example=200)
        check_int(owner, "window_steps", self.window_steps, minimum=8, example=1000)
        check_number(owner, "window_s", self.window_s, above=0.0, maximum=86400.0, example=30.0)
        check_int(owner, "min_samples", self.min_samples, minimum=SEGMENTS * 2, example=8)
        check_number(owner, "min_rate_mb_per_1k_steps", self.min_rate_mb_per_1k_steps,
                     above=0.0, example=32.0)
        check_number(owner, "min_growth_mb", self.min_growth_mb, minimum=0.0, example=32.0)
        check_bool(owner, "capture_sites", self.capture_sites)
        check_int(owner, "hold_steps", self.hold_steps, minimum=1, example=5)
        check_int(owner, "max_sites", self.max_sites, minimum=1, example=10)
