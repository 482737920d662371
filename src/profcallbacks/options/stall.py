"""When waiting for data counts as a stall: the options of the stall detector."""

from __future__ import annotations

from dataclasses import dataclass

from profcallbacks.options.checks import check_int, check_number


@dataclass(frozen=True, kw_only=True)
class StallConfig:
    """When waiting for data counts as a stall (defaults are justified in docs/explanation/detection.md and
    docs/explanation/stalls-and-syncs.md).

    The stall statistic is the median, over the last ``window`` steps cut into blocks of
    ``max(block_steps, num_workers)`` steps, of each block's share of step time spent waiting for
    data. A block is long enough to hold one burst of a multi-worker loader, and the median ignores
    a block spoiled by a one-off hiccup.

    A stall episode alerts once the median has stayed at or above ``share_threshold`` at every
    block since the episode began, over at least ``min_duration_s`` seconds of step time *and*
    ``min_steps`` steps (both counted from the episode's first step): a co-tenant's burst of
    load raises the share for a fraction of a second, a slow loader for good. An episode that
    has not held that long when the run ends is reported then if it covers most of the run's
    steps' time (a run too short for the hold), saying so.

    Args:
        share_threshold: Median block share (0-1) at or above which a stall episode begins.
        clear_share: Median block share (0-1) below which an alerted stall episode ends.
        window: Steps (at least; rounded up to whole blocks, 3 blocks minimum) the median covers.
        block_steps: Least steps per block; the loader's ``num_workers`` raises it.
        isolated_factor: A single wait this many times the median step time is reported as an
            isolated wait (when no stall is going on).
        isolated_min_s: Waits shorter than this (seconds) are never reported as isolated waits.
        max_isolated_reports: Most isolated-wait findings in one run.
        min_duration_s: Seconds of step time (the sum of the steps' own times) an episode holds
            before it alerts. 2 s: beside a process loading both cores in bursts, a healthy
            loop's episodes lasted at most 0.59 s (``benchmarks/stall_cotenant.py``, 20 runs of
            20 s); a 50% wait is flagged 2.0-2.1 s after it begins. 0: alert at the first window
            over the threshold.
        min_steps: Steps an episode holds before it alerts (20, the default window: long steps
            alert as soon as the window is over the threshold).
        time_workers: Time each ``DataLoader`` worker's batches (fetch, collate, send, start-up,
            and the main process's pinning) for loaders iterated through ``StepProfiler.wrap``
            or by the Lightning and HF Trainers, while the loop waits for data, a stall is open
            or a capture window records, so the stall finding says where the workers' time goes
            (``benchmarks/loader_cost.py``: under 1% of a batch of 5 ms or more, the sampler
            included).
        sample_workers: While a stall is open, sample each worker's stack every 20 ms of its
            CPU time to name the hot lines of the dataset's code.

    Example:
        >>> StallConfig(share_threshold=0.3, window=40).window
        40
    """

    share_threshold: float = 0.2
    clear_share: float = 0.1
    window: int = 20
    block_steps: int = 4
    isolated_factor: float = 5.0
    isolated_min_s: float = 0.05
    max_isolated_reports: int = 5
    min_duration_s: float = 2.0
    min_steps: int = 20
    time_workers: bool = True
    sample_workers: bool = True

    def __post_init__(self) -> None:
        owner = "StallConfig"
        check_number(owner, "share_threshold", self.share_threshold, minimum=0.01, maximum=1.0,
                     fix="Use e.g. share_threshold=0.2 (20% of step time).")
        check_number(owner, "clear_share", self.clear_share, minimum=0.0,
                     maximum=self.share_threshold,
                     fix="Use e.g. clear_share=0.1 (not above share_threshold).")
        check_int(owner, "window", self.window, minimum=1, maximum=100_000, example=20)
        check_int(owner, "block_steps", self.block_steps, minimum=1, maximum=10_000, example=4)
        check_number(owner, "isolated_factor", self.isolated_factor, minimum=1.0, example=5.0)
        check_number(owner, "isolated_min_s", self.isolated_min_s, minimum=0.0, example=0.05)
        check_int(owner, "max_isolated_reports", self.max_isolated_reports, minimum=0,
                  maximum=10_000, fix="Use 0 to never report isolated waits.")
        check_number(owner, "min_duration_s", self.min_duration_s, minimum=0.0, maximum=86400.0,
                     fix="Use e.g. min_duration_s=2.0 (seconds of step time a stall holds "
                     "before it alerts), or 0 to alert at the first window over the threshold.")
        check_int(owner, "min_steps", self.min_steps, minimum=1, maximum=100_000, example=20)
        for name in ("time_workers", "sample_workers"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{owner}({name}={getattr(self, name)!r}): expected True or "
                                 f"False, e.g. {name}=False to turn it off.")
