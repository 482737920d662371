"""Step-slowdown alerts: the run's typical speed as baseline, and slow stretches sustained in time.

How it decides (counted steps only, i.e. not captured, audited or compiling, not right after a
pause or the start, past ``warmup_steps``; every duration is the sum of the steps' own times, i.e. the run's
wall time without its pauses, so no clock is read):

- Baseline: the run's typical speed. Steps are cut into blocks of at least ``baseline_steps``
  steps and ``baseline_block_s`` seconds; the baseline is the median of the last
  ``baseline_blocks`` accepted block medians (15 blocks of >= 1 s by default). A lucky fast block
  or a slow one moves it by at most one rank of that median, never to an extreme. A block whose
  median is at or above ``threshold`` x baseline, or that ends during an alerted slowdown, is not
  accepted, so a slowdown never raises its own baseline (not even one in the second block).
  Lasting changes are followed: a speed-up by the median within half the window, a slowdown by
  re-baselining.
- Slow stretch. Each step time, capped at ``spike_cap`` x baseline, feeds a one-sided CUSUM with
  reference ``threshold`` x baseline: while it is positive, the steps since it last left zero
  have a capped mean at or above the threshold. That stretch is alerted once it has lasted
  ``min_steps`` steps *and* ``min_duration_s`` seconds at a step where the CUSUM is at its peak
  (the latest steps are still slow: the decaying tail after a short burst never alerts). For
  long steps the step count decides, for short ones the time (machine jitter comes in bursts of
  milliseconds to a second).
- Message. The alert quotes the stretch from its first slow step: its mean step time (at or
  above the threshold by construction), ratio, steps and seconds. The first slow step is the
  change point of a second CUSUM with reference halfway to the threshold, when the stretch from
  there is still at or above the threshold and the steps it adds before the alerted stretch are
  slow themselves (their mean is past halfway from the baseline to the alerted stretch's: else
  they are a mild slow stretch of the machine before the change), else the first step of the
  alerted stretch.
- Recovery: the mirror image (steps below ``recover_threshold`` x baseline for ``min_steps``
  steps and ``min_duration_s`` seconds): an info finding ``step_speed_recovered``.
- Re-baselining: an alerted slowdown still going on after ``rebaseline_after_steps`` steps and
  ``rebaseline_after_s`` seconds is the run's new normal: the baseline becomes the median of its
  blocks (``step_baseline_reset``, info), and only a further slowdown alerts.
- Early: before the first baseline block is complete, the median of the first ``early_steps``
  steps after the warm-up is a provisional reference, and a CUSUM like the one above (reference
  ``early_ratio`` x it, steps capped at twice that) alerts a large change sustained for
  ``min_steps`` steps and ``min_duration_s`` seconds against those first steps. A first block
  that ends slower than ``threshold`` x them takes them as its baseline: a typical step time is
  never a mix of two speeds.
- Captures: each alert asks for a capture (trigger ``slowdown``) unless one was asked for in the
  last ``capture_cooldown_steps`` steps (``details["capture"]`` says which).

Budgets (``benchmarks/slowdown_scenarios.py`` and ``benchmarks/slowdown_real.py`` measure
them): a sustained slowdown of 25% or more is alerted within max(50 steps, ``min_duration_s`` +
5 s) of its onset, and the first slow step is within max(100 steps, 2% of the steps since the
baseline was set) of the true onset.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable
from itertools import accumulate

from profcallbacks.core.timing import StepRecord, median
from profcallbacks.core.triggers import SLOWDOWN, CaptureRequest
from profcallbacks.detect.base import Participant
from profcallbacks.findings import STEP_BASELINE_RESET, STEP_SLOWDOWN, STEP_SPEED_RECOVERED, Finding
from profcallbacks.options.slowdown import SlowdownConfig

__all__ = ["SlowdownDetector"]

log = logging.getLogger(__name__)
_MAX_BLOCK_STEPS = 20_000  # a block of tiny steps ends here whatever its duration (bounded memory)


class _Stretch:
    """A one-sided CUSUM and the stretch of steps since it last left zero.

    ``at_peak``: the score is at its highest since the stretch began, i.e. the latest steps
    still lean past the reference (not the decaying tail of an earlier burst).
    """

    __slots__ = ("score", "peak", "first", "steps", "time_s", "at_peak")

    def __init__(self) -> None:
        self.score: float = 0.0
        self.peak: float = 0.0
        self.first: int = 0
        self.steps: int = 0
        self.time_s: float = 0.0
        self.at_peak: bool = False

    def clear(self) -> None:
        self.score = self.peak = self.time_s = 0.0
        self.first = self.steps = 0
        self.at_peak = False

    def run(self, times: list[float], k: int, end: int, first: int, ref: float, cap: float,
            sustain: tuple[int, float] | None = None, *, below: bool = False) -> tuple[int, bool]:
        """The CUSUM over the steps ``k`` to ``end - 1``: step ``first + i`` adds the distance of
        ``times[i]``, capped at ``cap``, past ``ref`` (``below``: under it), in seconds. A block
        of steps or one step (``[t], 0, 1``): the same code, in local variables.

        With ``sustain=(min_steps, min_duration_s)`` it stops after the first step at which the
        stretch is sustained (at its peak, over both minimums). Returns the first step not taken
        and whether it stopped there.
        """
        score, peak, start, steps, time_s, at = (self.score, self.peak, self.first, self.steps,
                                                 self.time_s, self.at_peak)
        min_steps, min_s = sustain if sustain is not None else (0, 0.0)
        stop, sustained = end, False
        sign = -1.0 if below else 1.0
        for i in range(k, end):
            t = times[i]
            excess = sign * ((t if t < cap else cap) - ref)
            if score > 0.0 or excess > 0.0:
                if score <= 0.0:  # a new stretch begins at this step
                    score, peak, start, steps, time_s = 0.0, 0.0, first + i, 0, 0.0
                score += excess
                steps += 1
                time_s += t
                at = score >= peak
                if at:
                    peak = score
                if score < 0.0:
                    score = 0.0
                if (sustain is not None and at and score > 0.0 and steps >= min_steps
                        and time_s >= min_s):
                    stop, sustained = i + 1, True
                    break
        self.score, self.peak, self.first, self.steps, self.time_s, self.at_peak = (
            score, peak, start, steps, time_s, at)
        return stop, sustained


class SlowdownDetector(Participant):
    """Raises one ``step_slowdown`` finding per sustained slowdown; O(1) work per step.

    Args:
        config: Thresholds and durations.
        rank: Global rank written into findings.
        capture: Alerts ask for a capture of the slow steps (``capture_on_slowdown``).

    Example:
        >>> config = SlowdownConfig(warmup_steps=0, baseline_steps=5, baseline_block_s=0,
        ...                         min_steps=3, min_duration_s=0.05)
        >>> det = SlowdownDetector(config)
        >>> found = [f for i in range(40) for f in det.observe(StepRecord(i, 0.01 * (1 + (i > 20)), 0))]
        >>> [(f.kind, f.details["first_slow_step"], f.details["ratio"]) for f in found]
        [('step_slowdown', 21, 2.0)]
    """

    def __init__(self, config: SlowdownConfig, *, rank: int = 0, capture: bool = True) -> None:
        self.config = config
        self.rank = rank
        self.capture = capture
        self.baseline_s: float | None = None
        self.slow = False
        self._threshold, self._recover = float(config.threshold), config.recover_ratio
        self._seen = 0
        self._block: list[float] = []
        self._block_s = 0.0
        self._accepted: deque[float] = deque(maxlen=config.baseline_blocks)
        self._episode_blocks: deque[float] = deque(maxlen=config.baseline_blocks)
        self._recent: deque[float] = deque(maxlen=config.baseline_steps)
        self._up, self._onset, self._down = _Stretch(), _Stretch(), _Stretch()
        self._cap_s = self._up_ref = self._onset_ref = self._down_ref = 0.0
        self._alert_step = 0
        self._since_alert_steps, self._since_alert_s = 0, 0.0
        self._last_capture: int | None = None
        self._early_ref: float | None = None  # median of the first early_steps steps
        self._early_on = config.early_ratio is not None
        self._early_limit = self._early_cap = 0.0
        self._early_up = _Stretch()

    @property
    def ratio(self) -> float | None:
        """Median of the last ``baseline_steps`` steps over the baseline, once both exist."""
        if self.baseline_s is None or not self._recent:
            return None
        return median(self._recent) / self.baseline_s

    def scalars(self) -> dict[str, float]:
        """Logged with each step-time summary: ``slowdown_ratio`` (recent median over the
        baseline) and ``baseline_step_time_ms``."""
        ratio = self.ratio
        if ratio is None or self.baseline_s is None:
            return {}
        return {"slowdown_ratio": ratio, "baseline_step_time_ms": self.baseline_s * 1e3}

    def observe(self, record: StepRecord) -> Iterable[Finding]:
        """Takes one finished step (a block of one); returns the findings it completes."""
        return self.observe_block(record.step, [record.step_time_s], [record.data_wait_s],
                                  record.excluded, record.after_pause)

    def observe_block(self, first: int, times: list[float], waits: list[float], excluded: bool,
                      after_pause: bool) -> Iterable[Finding]:
        """Takes the finished steps of a block in order (:meth:`observe` is a block of one).

        While no stretch is open and no step passes the onset reference (the common case), a
        step only feeds the baseline block: the CUSUMs are not touched (they would stay at 0).
        The others run through the CUSUMs block-at-once until a step needs a look of its own.
        """
        n = len(times)
        start = 1 if after_pause else 0
        if excluded or start >= n:
            return ()
        counted = n - start
        warm = self.config.warmup_steps - self._seen  # counted steps still in the warm-up
        self._seen += counted
        if warm > 0:
            start += min(warm, counted)
        found: list[Finding] = []
        k = start
        while k < n:
            k = self._quiet_segment(times, k, n)
            if k < n:
                if self.baseline_s is not None and not self.slow:
                    k = self._open_segment(first, times, k, n, found)
                elif self.baseline_s is None and self._early_on and self._early_ref is not None:
                    k = self._open_early_segment(first, times, k, n, found)
                else:
                    k = self._single_step(first, times, k, found)
        return found

    def _block_close(self, times: list[float], k: int, n: int) -> tuple[list[float], int, int]:
        """Where the baseline block closes among the steps ``k`` to ``n - 1``.

        Returns the block's running sums from step ``k`` on (``sums[0]`` is its time so far),
        the closing step's offset from ``k`` (``n - k`` or more: not among them) and the end of
        the segment that ends with the closing step (``n`` if it does not close).
        """
        sums = list(accumulate(times[k:n], initial=self._block_s))  # in step order: exact
        lo = max(0, self.config.baseline_steps - len(self._block) - 1)
        close = bisect_left(sums, self.config.baseline_block_s, lo + 1) - 1
        close = min(close, _MAX_BLOCK_STEPS - len(self._block) - 1)
        return sums, close, (k + close + 1 if close < n - k else n)

    def _take(self, times: list[float], k: int, end: int, sums: list[float]) -> None:
        """Add the steps ``k`` to ``end - 1`` to the recent steps and the baseline block."""
        segment = times[k:end]
        self._recent.extend(segment)
        self._block.extend(segment)
        self._block_s = sums[end - k]

    def _quiet_segment(self, times: list[float], k: int, n: int) -> int:
        """Take the steps from ``k`` on that only feed the baseline block (no CUSUM moves).

        Those are, outside an alerted slowdown with no stretch open, the steps at or below the
        onset reference (their CUSUM terms are <= 0): before the first baseline, against the early
        reference (the early check's own limit too) once the first ``early_steps`` steps set it;
        with the early check off, every step before a baseline exists.
        The segment ends where the baseline block closes (it is closed here) or at a step that
        must be looked at on its own. Returns the first step not taken.
        """
        early = self.baseline_s is None and self._early_on
        if early:  # the first early_steps steps one by one (they set the early reference)
            quiet = self._early_ref is not None and not (
                self._early_up.score > 0.0 or self._up.score > 0.0 or self._onset.score > 0.0)
        else:
            quiet = self.baseline_s is None or not (
                self.slow or self._up.score > 0.0 or self._onset.score > 0.0)
        if not quiet:
            return k
        sums, close, end = self._block_close(times, k, n)
        if self.baseline_s is not None or early:
            reference = self._onset_ref if self._onset_ref < self._cap_s else self._cap_s
            if early and self._early_limit < reference:
                reference = self._early_limit
            over = end
            if end > k and max(times[k:end]) > reference:
                over = next(i for i in range(k, end) if times[i] > reference)
            if over < end:  # stop before the first step past the onset reference
                end, close = over, n
        if end == k:
            return k
        self._take(times, k, end, sums)
        if end - k - 1 == close:
            self._close_block()
        return end

    def _open_segment(self, first: int, times: list[float], k: int, n: int,
                      found: list[Finding]) -> int:
        """Steps from ``k`` on, outside an alerted slowdown, once a baseline exists.

        The two CUSUMs run block-at-once (:meth:`_Stretch.run`): this is the common case on a
        real machine, where every other step is a little over the onset reference. Ends after
        the step that closes the baseline block or raises an alert, or at ``n``. Returns the
        first step not taken.
        """
        sums, close, end = self._block_close(times, k, n)
        sustain = (self.config.min_steps, self.config.min_duration_s)
        stop, alert = self._up.run(times, k, end, first, self._up_ref, self._cap_s, sustain)
        self._onset.run(times, k, stop, first, self._onset_ref, self._cap_s)
        self._take(times, k, stop, sums)
        if alert:
            found.append(self._alert(first + stop - 1))
        if stop - 1 - k == close:
            self._close_block()
        return stop

    def _open_early_segment(self, first: int, times: list[float], k: int, n: int,
                            found: list[Finding]) -> int:
        """Steps from ``k`` on before the first baseline, once the early reference is set: the
        early check's CUSUM alerts, the two others are followed (not alerted) until the first
        block says whether its first steps are typical. Ends like :meth:`_open_segment`;
        returns the first step not taken.
        """
        sums, close, end = self._block_close(times, k, n)
        sustain = (self.config.min_steps, self.config.min_duration_s)
        stop, alert = self._early_up.run(times, k, end, first, self._early_limit,
                                         self._early_cap, sustain)
        self._up.run(times, k, stop, first, self._up_ref, self._cap_s)
        self._onset.run(times, k, stop, first, self._onset_ref, self._cap_s)
        self._take(times, k, stop, sums)
        if alert:  # the first block mixes both speeds: _early_alert drops it
            found.append(self._early_alert(first + stop - 1))
        elif stop - 1 - k == close:
            self._close_block()
        return stop

    def _single_step(self, first: int, times: list[float], k: int, found: list[Finding]) -> int:
        """Step ``k`` on its own: one during an alerted slowdown (recovery, re-baselining), or
        one before the first baseline while the early reference is not set (the step that
        completes the first ``early_steps`` sets it). Returns ``k + 1``."""
        sums, close, _ = self._block_close(times, k, k + 1)
        self._take(times, k, k + 1, sums)
        if self.baseline_s is not None:  # slow: only steps of an alerted slowdown come here
            found += self._observe_slow(times, k, first)
        elif self._early_on and len(self._block) == self.config.early_steps:
            ref = median(self._block)
            ratio = max(float(self.config.early_ratio or 0.0), self._threshold)
            self._early_ref, self._early_limit = ref, ratio * ref
            self._early_cap = 2.0 * ratio * ref
            self._set_references(ref)  # provisional: the first block may keep them
        if close == 0:  # the step closes the baseline block
            self._close_block()
        return k + 1

    def _early_alert(self, step: int) -> Finding:
        """A large change before the first baseline: alerted against the first steps."""
        ref = self._early_ref
        assert ref is not None
        self._up, self._early_up = self._early_up, _Stretch()
        self._onset.clear()
        self._early_on = False
        self._accepted.clear()
        self._accepted.append(ref)
        self._set_baseline(ref)
        self._block, self._block_s = [], 0.0  # the first block mixes both speeds: dropped
        return self._alert(step, early=True)

    def _observe_slow(self, times: list[float], k: int, first: int) -> list[Finding]:
        """Step ``first + k`` during an alerted slowdown: recovery or re-baselining."""
        step = first + k
        self._since_alert_steps += 1
        self._since_alert_s += times[k]
        self._down.run(times, k, k + 1, first, self._down_ref, self._cap_s, below=True)
        if self._sustained(self._down):
            return [self._recovered(step)]
        if self._rebaseline_due():
            return [self._rebaseline(step)]
        return []

    def _sustained(self, stretch: _Stretch) -> bool:
        return (stretch.at_peak and stretch.score > 0.0 and stretch.steps >= self.config.min_steps
                and stretch.time_s >= self.config.min_duration_s)

    def _rebaseline_due(self) -> bool:
        limit = self.config.rebaseline_after_steps
        return (limit is not None and self._since_alert_steps >= limit
                and self._since_alert_s >= self.config.rebaseline_after_s)

    def _close_block(self) -> None:
        """A block is complete: accept its median into the baseline, or hold it out."""
        block_median = median(self._block)
        self._block, self._block_s = [], 0.0
        if self.slow:
            self._episode_blocks.append(block_median)
            return
        if self.baseline_s is not None and block_median >= self._threshold * self.baseline_s:
            return  # a slow stretch (alerted or not yet) never raises its own baseline
        if self.baseline_s is None and self._early_on:
            self._early_on, ref = False, self._early_ref
            self._early_up.clear()
            if ref is not None and block_median >= self._threshold * ref:
                block_median = ref  # the block ends slower than it began: its first steps,
            else:  # and the slow stretch followed against them goes on; else a new start
                self._up.clear()
                self._onset.clear()
        self._accepted.append(block_median)
        self._set_baseline(median(self._accepted))

    def _set_baseline(self, baseline_s: float) -> None:
        self.baseline_s = baseline_s
        self._set_references(baseline_s)

    def _set_references(self, baseline_s: float) -> None:
        self._cap_s = self.config.spike_ratio * baseline_s
        self._up_ref = self._threshold * baseline_s
        self._onset_ref = (1.0 + self._threshold) / 2 * baseline_s
        self._down_ref = self._recover * baseline_s

    def _alert(self, step: int, *, early: bool = False) -> Finding:
        base = self.baseline_s
        assert base is not None
        up, onset = self._up, self._onset
        stretch = up
        if onset.steps and onset.first <= up.first and onset.time_s / onset.steps >= self._up_ref:
            # the steps the onset stretch adds before the alerted one: slow (the change began
            # there), or closer to the baseline (a mild stretch of the machine before it)?
            lead_steps, lead_s = onset.steps - up.steps, onset.time_s - up.time_s
            midway = (base + up.time_s / up.steps) / 2
            if lead_steps <= 0 or lead_s / lead_steps >= midway:
                stretch = onset
        first, steps, time_s = stretch.first, stretch.steps, stretch.time_s
        observed = time_s / steps
        ratio = observed / base
        self.slow, self._alert_step = True, step
        self._since_alert_steps, self._since_alert_s = 0, 0.0
        self._up.clear()
        self._onset.clear()
        self._down.clear()
        self._episode_blocks.clear()
        cooldown, last = self.config.capture_cooldown_steps, self._last_capture
        capture = self.capture and (last is None or step - last >= cooldown)
        if capture:
            self._last_capture = step
        tail = ("; capturing the slow steps" if capture else
                f"; no capture (one was asked for at step {last})" if self.capture else "")
        return Finding(
            STEP_SLOWDOWN, step=step, rank=self.rank, severity="warning",
            message=(f"steps are {ratio:.2f}x slower since step {first}: {_ms(observed)} per "
                     f"step over {steps} steps ({time_s:.1f} s) against a typical "
                     f"{_ms(base)}" + (f" (the first {self.config.early_steps} steps after the "
                                       "warm-up: the speed changed before a baseline formed)"
                                       if early else "") + tail),
            details={"first_slow_step": first, "baseline_step_time_s": base,
                     "observed_step_time_s": observed, "ratio": round(ratio, 4),
                     "slow_steps": steps, "slow_duration_s": round(time_s, 3),
                     "threshold": self._threshold, "min_duration_s": self.config.min_duration_s,
                     "capture": capture, "early": early},
            capture=CaptureRequest(SLOWDOWN) if capture else None)

    def _recovered(self, step: int) -> Finding:
        base = self.baseline_s
        assert base is not None
        down = self._down
        first, steps, time_s = down.first, down.steps, down.time_s
        observed = time_s / steps
        self.slow = False
        down.clear()
        return Finding(
            STEP_SPEED_RECOVERED, step=step, rank=self.rank, severity="info",
            message=(f"step time is back to {observed / base:.2f}x the typical {_ms(base)} "
                     f"since step {first} ({steps} steps, {time_s:.1f} s); slow "
                     f"since step {self._alert_step}"),
            details={"baseline_step_time_s": base, "ratio": round(observed / base, 4),
                     "recovered_since_step": first, "slow_since_step": self._alert_step,
                     "slow_steps": self._since_alert_steps,
                     "slow_duration_s": round(self._since_alert_s, 3)})

    def _rebaseline(self, step: int) -> Finding:
        old = self.baseline_s
        assert old is not None
        blocks = list(self._episode_blocks) or [median(self._recent)]
        new = median(blocks)
        self.slow = False
        self._down.clear()
        self._accepted.clear()
        self._accepted.extend(blocks)
        self._set_baseline(new)
        return Finding(
            STEP_BASELINE_RESET, step=step, rank=self.rank, severity="info",
            message=(f"steps have been slow since step {self._alert_step} "
                     f"({self._since_alert_steps} steps, {self._since_alert_s:.1f} s); "
                     f"{_ms(new)} is the new typical step time (was {_ms(old)}), only further "
                     "slowdowns alert"),
            details={"old_baseline_step_time_s": old, "baseline_step_time_s": new,
                     "slow_since_step": self._alert_step})


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.2f} ms" if ms < 10 else f"{ms:.1f} ms"
