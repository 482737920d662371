"""Cross-rank straggler check: every N steps, one all_gather of a few floats per rank.

Every rank keeps the step times and data waits of its counted steps (not excluded, not right after
a pause) since the last check. At each step whose number is a multiple of ``every_n_steps`` (minus
one: steps 199, 399, ... for 200), every rank calls one ``all_gather`` of three floats (median step
time, mean data wait, step count) on the default process group; never on other steps. Because the
check steps depend on the step number alone, all ranks meet at the same collective.

The straggler rule (:func:`slow_ranks`; ``profcallbacks report`` applies the same one to the
whole run's per-rank numbers): a rank is slow when its median step time is above ``threshold``
(1.15) x the median of the other ranks' median step times, or when it waits for data longer than
the other ranks (their median) by more than ``threshold - 1`` of their step time. In a live check,
a rank slow in ``consecutive`` checks in a row is reported once (``Finding(kind="straggler")`` on
global rank 0), until it stops being slow.

Off by default (``SlowdownConfig(straggler=None)``): every rank must run the profiler and reach
the same steps, or the rank that calls the collective alone waits for ever. A profiler built on
rank 0 only (``if rank == 0: prof = StepProfiler(...)``) is a common pattern this must not hang.

In synchronous data parallel training (DDP, FSDP) the gradient all-reduce makes every rank's
step time that of the slowest, so step times rarely differ: a straggler then shows as the rank
that waits less inside the step, which the host clock cannot see, or as the rank that waits longer
for its data, which this check reports.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import reduce
from operator import add

from profcallbacks.core.timing import StepRecord, median
from profcallbacks.detect.base import Participant
from profcallbacks.findings import STRAGGLER, Finding
from profcallbacks.options.straggler import STRAGGLER_THRESHOLD, StragglerConfig

__all__ = ["SlowRank", "StragglerDetector", "slow_ranks"]

log = logging.getLogger(__name__)

Gather = Callable[[list[float]], list[list[float]]]
"""Takes this rank's summary floats; returns every rank's, indexed by rank (a collective)."""


class StragglerDetector(Participant):
    """Flags a rank that is consistently slower than the others.

    Args:
        config: Check interval and thresholds.
        rank: This process's global rank (findings are emitted on rank 0 only).
        gather: The collective (default: ``torch.distributed.all_gather`` on the default group,
            checked at the first check step; without an initialised group of 2+ ranks the
            detector turns itself off).

    Example:
        >>> det = StragglerDetector(StragglerConfig(every_n_steps=2, consecutive=1, min_steps=1),
        ...                         rank=0, gather=lambda mine: [mine, [mine[0] * 2, 0.0, 2.0]])
        >>> [f.details["slow_rank"] for i in range(2) for f in det.observe(StepRecord(i, 0.1, 0))]
        [1]
    """

    def __init__(self, config: StragglerConfig, *, rank: int = 0,
                 gather: Gather | None = None) -> None:
        self.config = config
        self.rank = rank
        self._gather = gather
        self._every = config.every_n_steps
        self._times: list[float] = []
        self._wait_s = 0.0
        self._streak: dict[int, int] = {}
        self._reported: set[int] = set()
        self._disabled = False

    def boundary_step(self, step: int) -> int:
        """The session must hand over the steps before this one at once (a collective follows).

        Every rank then meets the others between the same two steps, also when the training
        loop runs collectives of its own.
        """
        return (step // self._every + 1) * self._every

    def observe(self, record: StepRecord) -> Iterable[Finding]:
        """Takes one finished step (a block of one); at a check step, meets the other ranks."""
        return self.observe_block(record.step, [record.step_time_s], [record.data_wait_s],
                                  record.excluded, record.after_pause)

    def observe_block(self, first: int, times: list[float], waits: list[float], excluded: bool,
                      after_pause: bool) -> Iterable[Finding]:
        """Collects the block's counted steps; at each check step in it (a multiple of
        ``every_n_steps``, minus one), meets the other ranks (a collective). If that raises,
        the session disables this detector."""
        found: list[Finding] = []
        i, n = 0, len(times)
        while i < n and not self._disabled:  # segments that end at a check step, or at the end
            j = min(n, i + self._every - (first + i) % self._every)
            if not excluded:
                k = 1 if after_pause and i == 0 else i
                self._times += times[k:j]
                self._wait_s = reduce(add, waits[k:j], self._wait_s)  # in step order
            if (first + j) % self._every == 0:
                found += self._check(first + j - 1)
            i = j
        return found

    def _check(self, step: int) -> list[Finding]:
        times, self._times = self._times, []
        wait, self._wait_s = self._wait_s, 0.0
        gather = self._gather or _default_gather()
        if gather is None:
            log.info("profcallbacks: no torch.distributed group of 2+ ranks; the straggler check "
                     "is off.")
            self._disabled = True
            return []
        self._gather = gather
        mine = [median(times) if times else 0.0,
                wait / len(times) if times else 0.0, float(len(times))]
        summaries = gather(mine)
        if self.rank != 0:
            return []
        return self._judge(step, summaries)

    def _judge(self, step: int, summaries: list[list[float]]) -> list[Finding]:
        judged = {r: (s[0], s[1]) for r, s in enumerate(summaries) if s[2] >= self.config.min_steps}
        slow = slow_ranks(judged, self.config.threshold)
        findings = []
        for r in judged:
            if r not in slow:
                self._streak.pop(r, None)
                self._reported.discard(r)
                continue
            self._streak[r] = self._streak.get(r, 0) + 1
            if self._streak[r] >= self.config.consecutive and r not in self._reported:
                self._reported.add(r)
                findings.append(self._finding(step, r, slow[r]))
        return findings

    def _finding(self, step: int, slow_rank: int, verdict: SlowRank) -> Finding:
        median_s, wait_s, ref_s, ref_wait_s = (verdict.step_time_s, verdict.data_wait_s,
                                               verdict.others_step_time_s, verdict.others_data_wait_s)
        slow_time = verdict.slow_step_time
        ratio = verdict.ratio
        cause = (f"its steps take {median_s * 1e3:.1f} ms against {ref_s * 1e3:.1f} ms on the "
                 f"other ranks ({ratio:.2f}x)" if slow_time else
                 f"it waits {wait_s * 1e3:.1f} ms per step for data against "
                 f"{ref_wait_s * 1e3:.1f} ms on the other ranks: its loader holds every rank back")
        return Finding(
            STRAGGLER, step=step, rank=self.rank, severity="warning",
            message=f"rank {slow_rank} is a straggler in {self._streak[slow_rank]} checks in a "
                    f"row: {cause}",
            details={"slow_rank": slow_rank, "step_time_s": median_s,
                     "others_step_time_s": ref_s, "ratio": round(ratio, 4),
                     "data_wait_s": wait_s, "others_data_wait_s": ref_wait_s,
                     "checks": self._streak[slow_rank], "every_n_steps": self._every})


@dataclass(frozen=True)
class SlowRank:
    """Why one rank counts as a straggler (times in seconds, or any one unit throughout)."""

    step_time_s: float
    data_wait_s: float
    others_step_time_s: float
    others_data_wait_s: float
    slow_step_time: bool
    slow_data_wait: bool

    @property
    def ratio(self) -> float:
        """Step time over the other ranks' median."""
        return self.step_time_s / self.others_step_time_s if self.others_step_time_s > 0 else math.inf

    @property
    def extra_data_wait_s(self) -> float:
        return self.data_wait_s - self.others_data_wait_s


def slow_ranks(timings: Mapping[int, tuple[float, float]],
               threshold: float = STRAGGLER_THRESHOLD) -> dict[int, SlowRank]:
    """The straggler rule: which ranks are slow, given each rank's (step time, data wait).

    Each rank is compared with the median of the other ranks (see the module docstring).

    Example:
        >>> sorted(slow_ranks({0: (0.100, 0.0), 1: (0.100, 0.0), 2: (0.130, 0.0)}))
        [2]
        >>> slow_ranks({0: (0.100, 0.0), 1: (0.100, 0.030)})[1].slow_data_wait
        True
    """
    slow = {}
    for rank, (step_s, wait_s) in timings.items():
        others = [t for r, t in timings.items() if r != rank]
        if not others:
            continue
        ref_s = median(t[0] for t in others)
        ref_wait_s = median(t[1] for t in others)
        slow_time = step_s > threshold * ref_s
        slow_wait = wait_s - ref_wait_s > (threshold - 1.0) * ref_s
        if slow_time or slow_wait:
            slow[rank] = SlowRank(step_s, wait_s, ref_s, ref_wait_s, slow_time, slow_wait)
    return slow


def _default_gather() -> Gather | None:
    """``all_gather`` on the default process group, or None without one of 2+ ranks."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    world = dist.get_world_size()
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())

    def gather(mine: list[float]) -> list[list[float]]:
        local = torch.tensor(mine, dtype=torch.float64, device=device)
        out = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(out, local)
        return [t.tolist() for t in out]  # a device sync on NCCL, once per check

    return gather
