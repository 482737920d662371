"""Dataloader stalls, found in the always-on step timing (no profiler needed)."""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from functools import reduce
from itertools import repeat
from operator import add

from profcallbacks.core.timing import StepRecord, median
from profcallbacks.detect.base import Participant
from profcallbacks.detect.loader_workers import LoaderWorkers
from profcallbacks.detect.loaders import LoaderInfo, restarts_workers, stall_advice
from profcallbacks.detect.worker_breakdown import STARTUP, startup_text, verdict
from profcallbacks.findings import DATALOADER_STALL, DATALOADER_STALL_CLEARED, DATALOADER_WAIT, Finding
from profcallbacks.options.stall import StallConfig

__all__ = ["StallDetector"]


@dataclass
class _Block:
    """A stall episode: pending until it has held ``min_duration_s`` and ``min_steps``."""

    first_step: int
    last_step: int = 0
    steps: int = 0
    wait_s: float = 0.0
    time_s: float = 0.0
    alerted: bool = False

    @property
    def share(self) -> float:
        return self.wait_s / self.time_s if self.time_s > 0 else 0.0


class StallDetector(Participant):
    """Turns step records into ``dataloader_stall`` episodes and isolated-wait notes.

    Steps with a profiler attached and steps right after a pause are left out of the statistic;
    a long wait right after the start or a pause is reported as a start-up wait instead. An
    episode alerts once it has held ``min_duration_s`` and ``min_steps``; ``close`` reports one
    that covers most of a run too short for that (``take_findings`` hands it over).

    Example:
        >>> detector = StallDetector(StallConfig(), rank=0)
        >>> findings = [f for i in range(300) for f in detector.observe(StepRecord(i, 0.01, 0.004))]
        >>> findings[0].kind, findings[0].details["share"], findings[0].details["held_s"]
        ('dataloader_stall', 0.4, 2.0)
    """

    def __init__(self, config: StallConfig, rank: int = 0) -> None:
        self.config = config
        self.rank = rank
        self.loader: LoaderInfo = {}
        self._block_len = config.block_steps
        self._needed = self._blocks_needed()
        # the last blocks as (first step, last step, steps, wait s, time s): a tuple, no object
        self._blocks: deque[tuple[int, int, int, float, float]] = deque(maxlen=self._needed)
        self._shares: deque[float] = deque(maxlen=self._needed)  # the blocks' data shares
        self._block_first, self._block_steps = 0, 0  # the block being filled
        self._block_wait_s, self._block_time_s = 0.0, 0.0
        self._isolated_limit_s = math.inf  # a wait this long is an isolated hiccup
        self._blocks_closed = 0
        self._step_times: deque[float] = deque(maxlen=max(config.window, 3 * config.block_steps))
        self._waits: deque[float] = deque(maxlen=self._step_times.maxlen)
        self._reference_s: float | None = None  # median step time of the recent steps
        self._episode: _Block | None = None
        self._judged_s = 0.0  # step time of the closed blocks: the run's time the median judged
        self._at_end: list[Finding] = []  # an episode reported by close()
        self._isolated_reports = 0
        self._restarted = False  # a pass began that starts the loader's workers again
        self._startup_until = 0  # steps before this one wait for the workers' start-up too
        self.workers: LoaderWorkers | None = None  # the loader's worker timing (the session's)
        self._workers_on = False

    def _blocks_needed(self) -> int:
        return max(3, math.ceil(self.config.window / self._block_len))

    def set_loader(self, info: LoaderInfo) -> None:
        """Use what is known of the loader (from ``describe_loader``) for block size and advice.

        A further pass over a loader whose workers start again (``info["passes"]``, counted by
        the session) makes the next start-up wait that pass's.
        """
        passes = int(info.get("passes") or 1)
        self._restarted = passes > int(self.loader.get("passes") or 1) and restarts_workers(info)
        self.loader = dict(info)
        block = max(self.config.block_steps, int(info.get("num_workers") or 0))
        if block != self._block_len:
            self._block_len = block
            self._needed = self._blocks_needed()
            self._blocks = deque(self._blocks, maxlen=self._needed)
            self._shares = deque((b[3] / b[4] if b[4] > 0 else 0.0 for b in self._blocks),
                                 maxlen=self._needed)
            self._step_times = deque(self._step_times, maxlen=max(self.config.window, 3 * block))
            self._waits = deque(self._waits, maxlen=self._step_times.maxlen)

    def observe(self, record: StepRecord) -> Iterable[Finding]:
        """Takes one finished step (a block of one); returns the findings it completes."""
        return self.observe_block(record.step, [record.step_time_s], [record.data_wait_s],
                                  record.excluded, record.after_pause)

    def observe_block(self, first: int, times: list[float], waits: list[float], excluded: bool,
                      after_pause: bool) -> Iterable[Finding]:
        """Takes the finished steps of a block in order, in list operations (:meth:`observe` is a
        block of one): whole blocks of this detector at once while none can find anything."""
        if excluded:
            return ()
        found: list[Finding] = []
        i, n = 0, len(times)
        if after_pause:
            found += self._startup_wait(StepRecord(first, times[0], waits[0], False, True))
            i = 1
        i = max(i, min(n, self._startup_until - first))  # later workers' first batches
        quiet = True  # try whole blocks at once until a block needs looking at
        while i < n:  # segments that end where one of our blocks closes, or at the end
            if quiet and self._block_steps == 0 and self._episode is None:
                j = self._quiet_blocks(first, times, waits, i, n)
                quiet, i = j > i, j
                if i >= n:
                    break
            if self._block_steps == 0:
                self._block_first = first + i
            j = min(n, i + self._block_len - self._block_steps)
            seg_waits = waits[i:j]
            if self._episode is None and max(seg_waits) >= self._isolated_limit_s:
                limit = self._isolated_limit_s
                for k in range(i, j):
                    if waits[k] >= limit:
                        found += self._isolated(StepRecord(first + k, times[k], waits[k]),
                                                "isolated", self._reference_s)
            seg_times = times[i:j]
            self._step_times.extend(seg_times)
            self._waits.extend(seg_waits)
            self._block_steps += j - i
            self._block_wait_s = reduce(add, seg_waits, self._block_wait_s)  # in step order,
            self._block_time_s = reduce(add, seg_times, self._block_time_s)  # as step by step
            if self._block_steps >= self._block_len:
                found += self._close_block(first + j - 1)
            i = j
        return found

    def _quiet_blocks(self, first: int, times: list[float], waits: list[float], i: int,
                      n: int) -> int:
        """Take the whole blocks from step ``i`` on at once when none of them can find anything.

        That is when no episode is open, every share the median will see is under the
        threshold, and no wait reaches an isolated-wait limit in force: the common case, where
        going block by block (every 4 steps) would be most of this detector's cost. The state
        left is the one block-by-block processing leaves. Returns the first step not taken
        (``i``: none, do it block by block).
        """
        size, needed = self._block_len, self._needed
        count = (n - i) // size
        if count < needed:
            return i
        end = i + count * size
        seg_times, seg_waits = times[i:end], waits[i:end]
        # each block's sums left to right, as steps are added one by one (reduce, no frame)
        wait_sums = list(map(reduce, repeat(add), zip(*[iter(seg_waits)] * size, strict=True)))
        time_sums = list(map(reduce, repeat(add), zip(*[iter(seg_times)] * size, strict=True)))
        shares = [w / t if t > 0 else 0.0 for w, t in zip(wait_sums, time_sums, strict=True)]
        threshold = self.config.share_threshold
        if max(shares) >= threshold or (self._shares and max(self._shares) >= threshold):
            return i
        # the reference step time is taken again after each block numbered 1 mod ``needed``,
        # from the step times the deque holds then
        retaken = [q for q in range(count) if (self._blocks_closed + q + 1) % needed == 1]
        longest_wait = max(seg_waits)
        if longest_wait < self.config.isolated_min_s:  # under every limit: only the last matters
            retaken = retaken[-1:]
        limits, reference = [self._isolated_limit_s], self._reference_s
        for q in retaken:
            reference = self._reference_at(seg_times, (q + 1) * size)
            limits.append(max(self.config.isolated_min_s,
                              self.config.isolated_factor * reference))
        if longest_wait >= min(limits):
            return i
        self._step_times.extend(seg_times)
        self._waits.extend(seg_waits)
        for q in range(max(0, count - needed), count):  # only the last blocks are kept
            self._blocks.append((first + i + q * size, first + i + (q + 1) * size - 1, size,
                                 wait_sums[q], time_sums[q]))
        self._shares.extend(shares)
        self._want_workers(shares[-1] >= self.config.clear_share)
        self._judged_s = reduce(add, time_sums, self._judged_s)  # block by block, in order
        self._blocks_closed += count
        self._block_first = first + end - size
        self._reference_s, self._isolated_limit_s = reference, limits[-1]
        return end

    def _reference_at(self, seg_times: list[float], taken: int) -> float:
        """The median step time the deque would hold after ``taken`` more steps."""
        span = self._step_times.maxlen or 0
        if taken >= span:
            return median(seg_times[taken - span:taken])
        return median([*self._step_times, *seg_times[:taken]][-span:])

    def _close_block(self, last_step: int) -> list[Finding]:
        wait_s, time_s = self._block_wait_s, self._block_time_s
        block = (self._block_first, last_step, self._block_steps, wait_s, time_s)
        self._block_steps, self._block_wait_s, self._block_time_s = 0, 0.0, 0.0
        self._blocks.append(block)
        self._shares.append(wait_s / time_s if time_s > 0 else 0.0)
        self._want_workers(self._episode is not None or self._shares[-1] >= self.config.clear_share)
        self._judged_s += time_s
        self._blocks_closed += 1
        if self._blocks_closed % self._needed == 1:  # the first block, then once a window
            self._reference_s = median(self._step_times)
            self._isolated_limit_s = max(self.config.isolated_min_s,
                                         self.config.isolated_factor * self._reference_s)
        if len(self._blocks) == self._needed:
            return self._evaluate(block)
        return []

    def _evaluate(self, latest: tuple[int, int, int, float, float]) -> list[Finding]:
        share = median(self._shares)
        episode = self._episode
        if episode is None:
            if share < self.config.share_threshold:
                return []
            episode = self._episode = _Block(self._blocks[0][0], latest[1])
            for _, _, steps, wait_s, time_s in self._blocks:
                episode.steps, episode.wait_s = episode.steps + steps, episode.wait_s + wait_s
                episode.time_s += time_s
            return self._held(episode, share)
        if not episode.alerted and share < self.config.share_threshold:
            self._episode = None  # it did not hold: a burst (e.g. a co-tenant's), not a stall
            return []
        _, last, steps, wait_s, time_s = latest
        episode.last_step, episode.steps = last, episode.steps + steps
        episode.wait_s, episode.time_s = episode.wait_s + wait_s, episode.time_s + time_s
        if not episode.alerted:
            return self._held(episode, share)
        if share >= self.config.clear_share:
            return []
        self._episode = None
        return [self._cleared_finding(episode, share)]

    def _want_workers(self, on: bool) -> None:
        """Worker timing (and stack sampling) while the last block waited for data at least
        ``clear_share`` of its time or an episode is open: the stall finding's breakdown."""
        if self.workers is not None and on != self._workers_on:
            self._workers_on = on
            self.workers.want("stall", on)

    def _held(self, episode: _Block, share: float) -> list[Finding]:
        """The alert, once the episode has held ``min_duration_s`` and ``min_steps``."""
        if episode.time_s < self.config.min_duration_s or episode.steps < self.config.min_steps:
            return []
        episode.alerted = True
        return [self._stall_finding(episode, share)]

    def close(self, *, failed: bool) -> None:
        """The run ended: an episode still holding that covers most of the steps judged (a run
        too short for ``min_duration_s``) is reported, saying so."""
        episode = self._episode
        if episode is None or episode.alerted:
            return
        if episode.time_s < 0.5 * (self._judged_s + self._block_time_s):
            return  # a stretch at the end of the run, not most of it: it did not hold
        episode.alerted = True
        self._at_end.append(self._stall_finding(episode, median(self._shares), run_ended=True))

    def take_findings(self) -> Iterable[Finding]:
        found, self._at_end = self._at_end, []
        return found

    def _stall_finding(self, episode: _Block, share: float, *, run_ended: bool = False) -> Finding:
        waits = list(self._waits)
        mean_wait = statistics.fmean(waits)
        bursty = mean_wait > 0 and median(waits) < 0.25 * mean_wait
        advice = stall_advice(self.loader, bursty=bursty)
        wait_ms = 1e3 * episode.wait_s / episode.steps
        step_ms = 1e3 * episode.time_s / episode.steps
        inside, workers = self._inside_loader(wait_ms, step_ms, advice)
        held = (f", most of the run: the run ended before the stall had lasted "
                f"{self.config.min_duration_s:g} s" if run_ended else "")
        message = (f"{share:.0%} of step time waiting for data ({wait_ms:.1f} ms "
                   f"of {step_ms:.1f} ms per step) over steps {episode.first_step}-"
                   f"{episode.last_step} ({episode.time_s:.1f} s{held}); a loader that keeps up "
                   f"would make steps up to {1 / max(1 - share, 1e-3):.2f}x faster{inside}. "
                   f"Try: {'; '.join(advice)}.")
        return Finding(DATALOADER_STALL, episode.last_step, self.rank, "warning", message, {
            "share": round(share, 4), "share_mean": round(episode.wait_s / episode.time_s, 4),
            "data_wait_ms_per_step": round(wait_ms, 3), "step_time_ms": round(step_ms, 3),
            "first_step": episode.first_step, "last_step": episode.last_step,
            "steps": episode.steps, "held_s": round(episode.time_s, 3),
            "min_duration_s": self.config.min_duration_s, "run_ended": run_ended,
            "bursty": bursty, "threshold": self.config.share_threshold,
            "block_steps": self._block_len, "loader": self.loader, "advice": advice,
            **workers})

    def _inside_loader(self, wait_ms: float, step_ms: float,
                       advice: list[str]) -> tuple[str, dict[str, object]]:
        """What the workers' timing says of the stall (``advice`` gets its fixes first): a
        sentence for the message and the finding's ``loader_workers`` details."""
        if self.workers is None:
            return "", {}
        try:
            breakdown = self.workers.breakdown()
            if breakdown is None:
                return "", {}
            found = verdict(breakdown, wait_ms=wait_ms, step_ms=step_ms, info=self.loader)
        except Exception as exc:  # the breakdown is never worth the finding
            return "", {"loader_workers_error": str(exc)}
        # the breakdown's fixes replace the generic ones about workers and __getitem__
        kept = [a for a in advice if "persistent_workers" in a or "prefetch_factor" in a
                or ("pin_memory" in a and not any("pin_memory" in f for f in found.fix))]
        advice[:] = [*found.fix, *kept]
        return (f". Inside the loader: {found.text}; the fix saves up to {found.gain_ms:.1f} ms "
                "per step", {"loader_workers": found.details})

    def _cleared_finding(self, episode: _Block, share: float) -> Finding:
        mean = episode.wait_s / episode.time_s if episode.time_s else 0.0
        message = (f"data wait is down to {share:.0%} of step time; the stall covered steps "
                   f"{episode.first_step}-{episode.last_step} "
                   f"({mean:.0%} of their time waiting for data).")
        return Finding(DATALOADER_STALL_CLEARED, episode.last_step, self.rank, "info", message, {
            "share": round(share, 4), "episode_share": round(mean, 4),
            "first_step": episode.first_step, "last_step": episode.last_step,
            "steps": episode.steps,
            "data_wait_ms_per_step": round(1e3 * episode.wait_s / max(episode.steps, 1), 3)})

    def _startup_wait(self, record: StepRecord) -> list[Finding]:
        floor = self.config.isolated_min_s
        if self._reference_s is not None:
            floor = max(floor, self.config.isolated_factor * self._reference_s)
        restarted, self._restarted = self._restarted, False
        # each worker's first batch waits for its start-up: neither isolated waits nor stall time
        self._startup_until = record.step + max(1, int(self.loader.get("num_workers") or 0))
        if record.data_wait_s < floor or record.data_wait_s <= 0:
            return []
        return self._isolated(record, "startup", self._reference_s, restarted=restarted)

    def _isolated(self, record: StepRecord, pattern: str, reference: float | None, *,
                  restarted: bool = False) -> list[Finding]:
        if self._isolated_reports >= self.config.max_isolated_reports:
            return []
        self._isolated_reports += 1
        last = self._isolated_reports == self.config.max_isolated_reports
        what = ("once, between steps with short waits (not a sustained stall)"
                if pattern != "startup" else
                f"at the start of pass {self.loader.get('passes')} over the loader (its "
                f"{self.loader.get('num_workers')} workers start again for each pass)"
                if restarted else "after the start or a pause (first batch, worker start-up)")
        advice = stall_advice(self.loader, bursty=False, startup=pattern == "startup")
        startup = self.workers.startup_s() if pattern == "startup" and self.workers else None
        startup_ms = 1e3 * max(a + b for a, b in startup) if startup else None
        message = (f"isolated data wait of {record.data_wait_s * 1e3:.1f} ms at step {record.step} "
                   f"{what}{startup_text(startup_ms, self.loader)}"
                   + (f". Try: {'; '.join(advice)}" if advice else "")
                   + (". Further isolated waits are not reported." if last else "."))
        details = {"pattern": pattern, "data_wait_ms": round(record.data_wait_s * 1e3, 3),
                   "workers_restarted": restarted,
                   "step_time_ms": round(record.step_time_s * 1e3, 3), "advice": advice,
                   "median_step_time_ms": None if reference is None else round(reference * 1e3, 3)}
        if startup:
            details.update(part=STARTUP, startup_ms=round(startup_ms or 0.0, 3), workers_startup_ms=[
                {"to_init_ms": round(a * 1e3, 3), "init_ms": round(b * 1e3, 3)} for a, b in startup])
        return [Finding(DATALOADER_WAIT, record.step, self.rank, "info", message, details)]
