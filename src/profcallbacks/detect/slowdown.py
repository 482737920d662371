"""Step-slowdown alerts: a robust online baseline of step time and a hysteresis alarm on top of it.

How it decides (all numbers are eligible steps: not captured, not right after a pause or start,
past ``warmup_steps``):

- Baseline. The first ``baseline_steps`` eligible steps give the baseline: their median. After
  that, every further block of ``baseline_steps`` steps yields a block median, and the baseline
  moves *down* to a speed that two consecutive blocks confirm, never up. A baseline that followed
  the run upwards would follow a slow drift and never alert; the fastest confirmed speed does not.
- Window statistic. The mean of the last ``window`` step times, each step capped at
  ``spike_cap`` x baseline, so a one-off 3x spike moves it by at most ``(spike_cap - 1)/window``.
  It costs O(1) per step (a running sum over a ring).
- Alert. The window statistic at or above ``threshold`` x baseline for ``patience`` steps in a
  row raises one ``step_slowdown`` warning for the episode; the first slow step is the most likely
  change point in the recent steps (a CUSUM estimate).
- Hysteresis and recovery. The episode ends when the statistic stays below ``recover_threshold``
  x baseline for ``patience`` steps: an info finding ``step_speed_recovered``.
- Re-baselining. An episode that lasts ``rebaseline_after_steps`` eligible steps after its alert
  is taken as the run's new normal: the baseline becomes the median of the last ``window`` steps,
  an info finding ``step_baseline_reset`` says so, and only a further slowdown alerts again.
- Captures. Each alert asks the session for a capture (trigger ``slowdown``) unless one was asked
  for in the last ``capture_cooldown_steps`` steps (``details["capture"]`` says which).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from profcallbacks.core.checks import check_int, check_number, check_type, fail
from profcallbacks.core.timing import StepRecord, median
from profcallbacks.findings import STEP_BASELINE_RESET, STEP_SLOWDOWN, STEP_SPEED_RECOVERED, Finding

if TYPE_CHECKING:
    from profcallbacks.detect.straggler import StragglerConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlowdownConfig:
    """When slower steps raise an alert (see the module docstring for the method).

    Args:
        threshold: Ratio of recent to baseline step time that counts as slow (1.2 = 20% slower).
            Sustained slowdowns of 25% or more are alerted within 50 steps with the defaults
            (measured: a median of 24-25 steps, at most 41).
        recover_threshold: Ratio below which a slow episode is over; between 1 and ``threshold``
            (``None``: halfway, 1.1 for the default threshold).
        warmup_steps: Steps after start that never enter the baseline.
        baseline_steps: Steps per baseline block (the baseline is a block median).
        window: Recent steps whose capped mean is compared with the baseline.
        patience: Consecutive steps the comparison must hold before an alert (or a recovery).
        spike_cap: Single steps count as at most ``spike_cap`` x baseline in the window mean
            (``None``: ``threshold + 0.2``, 1.4 for the default threshold).
        rebaseline_after_steps: Steps an alerted episode must last before its level becomes the
            new baseline (``None``: never re-baseline).
        capture_cooldown_steps: Fewest steps between two captures asked for by slowdown alerts.
        straggler: Cross-rank straggler check (``None``: off; see ``StragglerConfig``).

    Example:
        >>> SlowdownConfig(threshold=1.3, window=40).recover_ratio
        1.15
    """

    threshold: float = 1.2
    recover_threshold: float | None = None
    warmup_steps: int = 20
    baseline_steps: int = 100
    window: int = 30
    patience: int = 3
    spike_cap: float | None = None
    rebaseline_after_steps: int | None = 200
    capture_cooldown_steps: int = 500
    straggler: StragglerConfig | None = None

    def __post_init__(self) -> None:
        owner = "SlowdownConfig"
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
        check_int(owner, "window", self.window, minimum=3, maximum=100_000, example=30)
        check_int(owner, "patience", self.patience, minimum=1, maximum=100_000, example=3)
        check_int(owner, "capture_cooldown_steps", self.capture_cooldown_steps, minimum=0,
                  example=500)
        if self.rebaseline_after_steps is not None:
            check_int(owner, "rebaseline_after_steps", self.rebaseline_after_steps, minimum=1,
                      example=200)
        if self.straggler is not None:
            from profcallbacks.detect.straggler import StragglerConfig

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


class SlowdownDetector:
    """Raises one ``step_slowdown`` finding per episode of slower steps; O(1) work per step.

    Args:
        config: Thresholds and window sizes.
        rank: Global rank written into findings.
        capture: Alerts ask for a capture of the slow steps (``capture_on_slowdown``).

    Example:
        >>> det = SlowdownDetector(SlowdownConfig(warmup_steps=0, baseline_steps=5, window=3))
        >>> found = [f for i in range(40) for f in det.observe(StepRecord(i, 0.01 * (1 + (i > 20)), 0))]
        >>> [(f.kind, f.details["ratio"]) for f in found]
        [('step_slowdown', 2.0)]
    """

    def __init__(self, config: SlowdownConfig, *, rank: int = 0, capture: bool = True) -> None:
        self.config = config
        self.rank = rank
        self.capture = capture
        self.baseline_s: float | None = None
        self.slow = False
        self._threshold = float(config.threshold)
        self._recover = config.recover_ratio
        self._warmup, self._block_size = config.warmup_steps, config.baseline_steps
        self._window, self._patience = config.window, config.patience
        self._alert_sum = self._recover_sum = 0.0  # threshold x window x baseline (and recover)
        self._seen = 0
        self._block: list[float] = []
        self._last_block_median: float | None = None
        self._ring = [0.0] * config.window       # capped step times, for the running sum
        self._pos = 0
        self._filled = 0
        self._sum = 0.0
        self._cap_s = 0.0
        self._recent: deque[tuple[int, float]] = deque(maxlen=2 * config.window + config.patience)
        self._run = 0                             # consecutive steps over (or under) the line
        self._alert_step = 0
        self._slow_steps = 0                      # eligible steps since the alert
        self._last_capture: int | None = None

    @property
    def ratio(self) -> float | None:
        """Capped window mean over baseline, once both exist."""
        if self.baseline_s is None or self._filled < len(self._ring):
            return None
        return self._sum / (self._filled * self.baseline_s)

    def scalars(self) -> dict[str, float]:
        """Logged with each step-time summary: median of the last ``window`` steps over the
        baseline (``slowdown_ratio``), and the baseline in milliseconds."""
        if self.ratio is None or self.baseline_s is None:
            return {}
        observed = median([t for _, t in list(self._recent)[-len(self._ring):]])
        return {"slowdown_ratio": observed / self.baseline_s,
                "baseline_step_time_ms": self.baseline_s * 1e3}

    def observe(self, record: StepRecord) -> Iterable[Finding]:
        """Takes one finished step; returns the findings it completes (usually none)."""
        if record.captured or record.after_pause:
            return ()
        # the common path is inlined: a few attribute reads and float operations
        self._seen += 1
        if self._seen <= self._warmup:
            return ()
        t = record.step_time_s
        self._recent.append((record.step, t))
        block = self._block
        block.append(t)
        if len(block) >= self._block_size and self._close_block():
            pass  # the ring was rebuilt from the recent steps, this one included
        elif self.baseline_s is None:
            return ()
        else:
            cap, ring, pos = self._cap_s, self._ring, self._pos
            capped = t if t < cap else cap
            self._sum += capped - ring[pos]
            ring[pos] = capped
            pos += 1
            self._pos = pos if pos < self._window else 0
            if self._filled < self._window:
                self._filled += 1
        if self._filled < self._window:
            return ()
        if not self.slow:
            if self._sum < self._alert_sum:
                self._run = 0
                return ()
            self._run += 1
            return (self._alert(record.step),) if self._run >= self._patience else ()
        return self._while_slow(record.step)

    def _while_slow(self, step: int) -> Iterable[Finding]:
        self._slow_steps += 1
        self._run = self._run + 1 if self._sum < self._recover_sum else 0
        if self._run >= self._patience:
            return (self._recovered(step),)
        limit = self.config.rebaseline_after_steps
        if limit is not None and self._slow_steps >= limit:
            return (self._rebaseline(step),)
        return ()

    def _close_block(self) -> bool:
        """A block of ``baseline_steps`` is complete: set or lower the baseline (True if so)."""
        block_median = median(self._block)
        self._block = []
        self._sum = sum(self._ring)  # no rounding drift in the running sum
        previous, self._last_block_median = self._last_block_median, block_median
        if self.baseline_s is None:
            self._set_baseline(block_median)
            return True
        if previous is not None and max(previous, block_median) < self.baseline_s and not self.slow:
            self._set_baseline(max(previous, block_median))
            return True
        return False

    def _set_baseline(self, baseline_s: float) -> None:
        self.baseline_s = baseline_s
        self._cap_s = self.config.spike_ratio * baseline_s
        cap, recent = self._cap_s, list(self._recent)[-len(self._ring):]
        self._ring = [0.0] * len(self._ring)
        for i, (_, t) in enumerate(recent):
            self._ring[i] = t if t < cap else cap
        self._filled = len(recent)
        self._pos = self._filled % len(self._ring)
        self._sum = sum(self._ring)
        self._alert_sum = self._threshold * self._window * baseline_s
        self._recover_sum = self._recover * self._window * baseline_s

    def _alert(self, step: int) -> Finding:
        assert self.baseline_s is not None
        ratio = self._sum / (self._window * self.baseline_s)
        self.slow, self._run, self._alert_step, self._slow_steps = True, 0, step, 0
        first = self._onset()
        observed = median([t for s, t in self._recent if s >= first])
        cooldown = self.config.capture_cooldown_steps
        last = self._last_capture
        capture = self.capture and (last is None or step - last >= cooldown)
        if capture:
            self._last_capture = step
        obs_ratio = observed / self.baseline_s
        return Finding(
            STEP_SLOWDOWN, step=step, rank=self.rank, severity="warning",
            message=(f"steps are {obs_ratio:.2f}x slower since step {first}: "
                     f"{observed * 1e3:.1f} ms against a baseline of {self.baseline_s * 1e3:.1f} ms"
                     + ("; capturing the slow steps" if capture else
                        f"; no capture (one was asked for at step {last})" if self.capture
                        else "")),
            details={"first_slow_step": first, "baseline_step_time_s": self.baseline_s,
                     "observed_step_time_s": observed, "ratio": round(obs_ratio, 4),
                     "window_ratio": round(ratio, 4), "threshold": self._threshold,
                     "capture": capture},
            capture="slowdown" if capture else None)

    def _onset(self) -> int:
        """The most likely first slow step among recent steps (CUSUM change point)."""
        assert self.baseline_s is not None
        k = (1.0 + self._threshold) / 2 * self.baseline_s
        cap = self._cap_s
        best, best_step, total = 0.0, self._recent[0][0], 0.0
        for step, t in reversed(self._recent):
            total += (t if t < cap else cap) - k
            if total >= best:
                best, best_step = total, step
        return best_step

    def _recovered(self, step: int) -> Finding:
        assert self.baseline_s is not None
        ratio = self._sum / (self._window * self.baseline_s)
        self.slow, self._run = False, 0
        return Finding(
            STEP_SPEED_RECOVERED, step=step, rank=self.rank, severity="info",
            message=(f"step time is back to {ratio:.2f}x the baseline of "
                     f"{self.baseline_s * 1e3:.1f} ms (slow since step {self._alert_step})"),
            details={"baseline_step_time_s": self.baseline_s, "window_ratio": round(ratio, 4),
                     "slow_since_step": self._alert_step, "slow_steps": self._slow_steps})

    def _rebaseline(self, step: int) -> Finding:
        old = self.baseline_s
        assert old is not None
        new = median([t for _, t in list(self._recent)[-len(self._ring):]])
        self.slow, self._run, self._last_block_median = False, 0, None
        self._block = []
        self._set_baseline(new)
        return Finding(
            STEP_BASELINE_RESET, step=step, rank=self.rank, severity="info",
            message=(f"steps have been slow since step {self._alert_step}; {new * 1e3:.1f} ms is "
                     f"the new baseline (was {old * 1e3:.1f} ms), only further slowdowns alert"),
            details={"old_baseline_step_time_s": old, "baseline_step_time_s": new,
                     "slow_since_step": self._alert_step})
