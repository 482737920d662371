"""Slowdown detector scenario suite: detection delay and false alerts across seeds.

Feeds synthetic 10 ms step times straight into ``SlowdownDetector`` (no clock, no sleeping: the
durations are the sums of the steps' times) and prints one table row per scenario: how many seeds
alerted, the detection delay after onset in steps and seconds (median and worst), and false
alerts (alerts before onset, or any alert in a scenario that must not alert). Real machines are
measured by ``benchmarks/slowdown_real.py``.

Usage:
    python benchmarks/slowdown_scenarios.py            # default SlowdownConfig, 20 seeds
    python benchmarks/slowdown_scenarios.py --seeds 200 --threshold 1.25
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from profcallbacks import SlowdownConfig
from profcallbacks.core.timing import StepRecord
from profcallbacks.detect.slowdown import SlowdownDetector

BASE_S = 0.010
Noise = Callable[[random.Random], float]

NOISES: dict[str, Noise] = {
    "uniform10": lambda r: r.uniform(0.9, 1.1),
    "gauss5": lambda r: max(0.5, r.gauss(1.0, 0.05)),
    "lognorm10": lambda r: r.lognormvariate(0.0, 0.10),
}


@dataclass(frozen=True)
class Scenario:
    name: str
    steps: int
    level: Callable[[int], float]        # slowdown factor at step i (1.0 = baseline speed)
    onset: int | None                    # first step that should alert (None: steady run)
    noise: str = "uniform10"
    spike_every: int = 50                # mean steps between isolated 3x spikes (0: none)
    pause_every: int = 0                 # an after_pause step (eval) every N steps, 2x slow
    allowed_from: int | None = None      # earliest step an alert is not false (default: onset)


def scenarios(threshold: float) -> list[Scenario]:
    out = []
    for noise in NOISES:
        out.append(Scenario(f"steady {noise} +spikes", 6000, lambda i: 1.0, None, noise))
    out.append(Scenario("steady +spikes 1/20", 6000, lambda i: 1.0, None, spike_every=20))
    out.append(Scenario("steady +eval pauses", 6000, lambda i: 1.0, None, pause_every=100))
    for size in (1.25, 1.5, 2.0, 3.0):
        for noise in ("uniform10", "lognorm10"):
            out.append(Scenario(f"step x{size} @3000 {noise}", 4500,
                                lambda i, s=size: s if i >= 3000 else 1.0, 3000, noise))
    out.append(Scenario("x1.3 for 10 s, recovers", 6000,
                        lambda i: 1.3 if 3000 <= i < 3800 else 1.0, 3000))
    out.append(Scenario("x1.5 for 3 s (no alert)", 6000,
                        lambda i: 1.5 if 3000 <= i < 3200 else 1.0, None))
    out.append(Scenario("x0.7 for 3 s, then x1 (no alert)", 6000,
                        lambda i: 0.7 if 3000 <= i < 3430 else 1.0, None))
    # +1% per 100 steps (1 s): followed by the typical-speed baseline, never alerted
    out.append(Scenario("drift +1%/s (followed)", 6000, lambda i: 1.0 + i / 10000, None))
    return out


@dataclass
class Result:
    alerted: int = 0
    false_alerts: int = 0
    delays: list[int] | None = None
    delays_s: list[float] = field(default_factory=list)
    first_slow_err: list[int] | None = None
    levels: list[float] = field(default_factory=list)


def run(scenario: Scenario, seed: int, config: SlowdownConfig
        ) -> tuple[list[int], list[int], list[float]]:
    """Alert steps, their estimated first slow steps, and each step's time for one seed."""
    rng = random.Random(seed)
    noise = NOISES[scenario.noise]
    det = SlowdownDetector(config)
    alerts, firsts, times = [], [], []
    for i in range(scenario.steps):
        factor = scenario.level(i) * noise(rng)
        if scenario.spike_every and rng.random() < 1 / scenario.spike_every:
            factor *= 3.0
        after_pause = bool(scenario.pause_every) and i % scenario.pause_every == 0
        if after_pause:
            factor *= 2.0
        times.append(BASE_S * factor)
        for f in det.observe(StepRecord(i, BASE_S * factor, 0.0, after_pause=after_pause)):
            if f.kind == "step_slowdown":
                alerts.append(f.step)
                firsts.append(f.details["first_slow_step"])
    return alerts, firsts, times


def evaluate(scenario: Scenario, seeds: int, config: SlowdownConfig) -> Result:
    res = Result(delays=[], first_slow_err=[])
    for seed in range(seeds):
        alerts, firsts, times = run(scenario, seed, config)
        onset = scenario.onset
        start = scenario.allowed_from if scenario.allowed_from is not None else onset
        good = [(a, f) for a, f in zip(alerts, firsts, strict=True) if start is not None and a >= start]
        res.false_alerts += len(alerts) - len(good)
        if good:
            res.alerted += 1
            assert res.delays is not None and res.first_slow_err is not None and onset is not None
            res.delays.append(good[0][0] - onset)
            res.delays_s.append(sum(times[onset:good[0][0] + 1]))
            res.first_slow_err.append(good[0][1] - onset)
            res.levels.append(scenario.level(good[0][0]))
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--threshold", type=float, default=SlowdownConfig().threshold)
    args = parser.parse_args()
    config = SlowdownConfig(threshold=args.threshold)
    print(f"SlowdownConfig: {config}\n{args.seeds} seeds per scenario; delay = steps from onset "
          "to alert; first-slow err = estimated first slow step minus true onset\n")
    header = (f"{'scenario':34} {'alerted':>8} {'delay med':>9} {'delay max':>9} {'max s':>6} "
              f"{'1st-slow err med':>16} {'level at alert':>14} {'false':>6}")
    print(header)
    print("-" * len(header))
    for sc in scenarios(args.threshold):
        r = evaluate(sc, args.seeds, config)
        d, e = r.delays or [], r.first_slow_err or []
        alerted = f"{r.alerted}/{args.seeds}" if sc.onset is not None else "-"
        worst_s = f"{max(r.delays_s):.1f}" if r.delays_s else "-"
        print(f"{sc.name:34} {alerted:>8} {_fmt(d, statistics.median):>9} {_fmt(d, max):>9} {worst_s:>6} "
              f"{_fmt(e, statistics.median):>16} {_levels(r.levels):>14} {r.false_alerts:>6}")
    det, rec = SlowdownDetector(config), StepRecord(0, BASE_S, 0.0)
    n = 200_000
    start = time.perf_counter()
    for _ in range(n):
        det.observe(rec)
    per_step_us = (time.perf_counter() - start) / n * 1e6
    print(f"\nobserve() cost: {per_step_us:.2f} us per step (steady state, this machine)")


def _levels(levels: list[float]) -> str:
    return f"{min(levels):.2f}-{max(levels):.2f}" if levels else "-"


def _fmt(values: list[int], fn: Callable[[list[int]], float]) -> str:
    return f"{fn(values):.0f}" if values else "-"


if __name__ == "__main__":
    main()
