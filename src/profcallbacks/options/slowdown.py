"""When slower steps raise an alert: the options of the slowdown detector (see
:mod:`profcallbacks.detect.slowdown` for the method and the budgets)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from profcallbacks.options.checks import check_int, check_number, check_type, fail

if TYPE_CHECKING:
    from profcallbacks.options.straggler import StragglerConfig

_OWNER = "SlowdownConfig"


@dataclass(frozen=True, kw_only=True)
class SlowdownConfig:
    """When slower steps raise an alert (see the module docstring for the method).

    Args:
        threshold: Ratio of step time to the baseline that counts as slow (1.2 = 20% slower).
        recover_threshold: Ratio below which a slow episode is over; at least 1 and below
            ``threshold`` (``None``: halfway, 1.1 for the default threshold).
        warmup_steps: Steps after start that are ignored.
        baseline_steps: Fewest steps in a baseline block.
        baseline_block_s: Fewest seconds of steps in a baseline block.
        baseline_blocks: Accepted blocks whose medians' median is the baseline.
        min_steps: Fewest steps a slow stretch (or a recovery) lasts before it is reported.
        min_duration_s: Fewest seconds of step time a slow stretch (or a recovery) lasts before
            it is reported (5 s: the longest jitter burst measured on a loaded VM was ~1-2 s).
        spike_cap: Single steps count as at most ``spike_cap`` x baseline (``None``:
            ``threshold + 0.2``, 1.4 for the default threshold).
        rebaseline_after_steps: Steps an alerted slowdown lasts before it becomes the new
            baseline (``None``: never re-baseline).
        rebaseline_after_s: Seconds of step time it must last as well.
        capture_cooldown_steps: Fewest steps between two captures asked for by slowdown alerts.
        early_ratio: Before the first baseline block is complete, steps at least this many
            times (or ``threshold`` times, if more) slower than the first ``early_steps`` steps
            after the warm-up, for
            ``min_steps`` steps and ``min_duration_s`` seconds, alert against those first steps
            (a speed that changes before a baseline forms); the first block then takes those
            steps as its baseline when it ends slower than ``threshold`` x them, so the typical
            step time is never a mix of two speeds (``None``: off).
        early_steps: Steps after the warm-up whose median is the early reference.
        straggler: Cross-rank straggler check (``None``: off; see ``StragglerConfig``).

    Example:
        >>> SlowdownConfig(threshold=1.3, min_duration_s=10).recover_ratio
        1.15
    """

    threshold: float = 1.2
    recover_threshold: float | None = None
    warmup_steps: int = 20
    baseline_steps: int = 100
    baseline_block_s: float = 1.0
    baseline_blocks: int = 15
    min_steps: int = 20
    min_duration_s: float = 5.0
    spike_cap: float | None = None
    rebaseline_after_steps: int | None = 200
    rebaseline_after_s: float = 60.0
    capture_cooldown_steps: int = 500
    early_ratio: float | None = 2.0
    early_steps: int = 20
    straggler: StragglerConfig | None = None

    def __post_init__(self) -> None:
        owner = _OWNER
        t = check_number(owner, "threshold", self.threshold, above=1.0, maximum=100.0,
                         fix="Use e.g. threshold=1.2 (a ratio of step times: 20% slower).")
        if self.recover_threshold is not None:
            halfway = round(1 + (t - 1) / 2, 3)
            check_number(owner, "recover_threshold", self.recover_threshold, minimum=1.0,
                         maximum=t, fix=f"Use e.g. recover_threshold={halfway} (between 1 and "
                         f"threshold={t}), or None.")
            if self.recover_threshold == t:
                raise fail(owner, "recover_threshold", t, f"below threshold={t}",
                           fix=f"Use e.g. recover_threshold={halfway}, or None.")
        if self.spike_cap is not None:
            check_number(owner, "spike_cap", self.spike_cap, above=t, maximum=1000.0,
                         fix=f"Use e.g. spike_cap={round(t + 0.2, 3)} (capped steps must be able "
                         f"to reach threshold={t}), or None.")
        check_int(owner, "warmup_steps", self.warmup_steps, minimum=0, example=20)
        check_int(owner, "baseline_steps", self.baseline_steps, minimum=5, maximum=100_000,
                  example=100)
        check_number(owner, "baseline_block_s", self.baseline_block_s, minimum=0.0,
                     maximum=3600.0, example=1.0)
        check_int(owner, "baseline_blocks", self.baseline_blocks, minimum=1, maximum=1000,
                  example=15)
        check_int(owner, "min_steps", self.min_steps, minimum=1, maximum=100_000, example=20)
        check_number(owner, "min_duration_s", self.min_duration_s, minimum=0.0, maximum=86400.0,
                     example=5.0)
        check_number(owner, "rebaseline_after_s", self.rebaseline_after_s, minimum=0.0,
                     example=60.0)
        check_int(owner, "capture_cooldown_steps", self.capture_cooldown_steps, minimum=0,
                  example=500)
        if self.early_ratio is not None:
            check_number(owner, "early_ratio", self.early_ratio, above=1.0, maximum=1000.0,
                         fix="Use e.g. early_ratio=2.0 (a ratio of step times), or None (off).")
        check_int(owner, "early_steps", self.early_steps, minimum=5, maximum=100_000, example=20)
        if self.rebaseline_after_steps is not None:
            check_int(owner, "rebaseline_after_steps", self.rebaseline_after_steps, minimum=1,
                      example=200)
        if self.straggler is not None:
            from profcallbacks.options.straggler import StragglerConfig

            check_type(owner, "straggler", self.straggler, StragglerConfig,
                       "a profcallbacks.StragglerConfig or None (off)", "StragglerConfig()")

    @property
    def spike_ratio(self) -> float:
        """``spike_cap``, or ``threshold + 0.2`` when not given."""
        return float(self.spike_cap) if self.spike_cap is not None else round(self.threshold + 0.2, 6)

    @property
    def recover_ratio(self) -> float:
        """``recover_threshold``, or halfway between 1 and ``threshold`` when not given."""
        if self.recover_threshold is not None:
            return float(self.recover_threshold)
        return round(1.0 + (self.threshold - 1.0) / 2, 6)
