"""Calibration of the report's gains against fixes applied for real, on the CPU.

For each scenario (``benchmarks/calibration_scenarios.py``) the loop with the pattern is profiled
once through ``StepProfiler`` and read by the report, whose diagnosis of the scenario's kind gives
the *predicted* gain per step (0 when it names nothing). Then the loop with the pattern and the loop
with the fix run untraced, in alternating blocks (interleaved, so a machine that slows down for a
while slows both); each variant's step time is its median block and the *measured* gain the median
of the rounds' differences (each round times both variants side by side). Medians, not the fastest
block: on a memory-bound step the difference of the two fastest blocks swung by 4 ms of a 19 ms
step from run to run, and on a busy machine the fastest block of an oversubscribed loop is the
rare one no other job held up, not the step the user gets. A prediction
meets the target when it is within 30% (or 1 ms) of the measured gain; for a fix that measurably
gains nothing (under 5% of the step, or slower) a predicted gain under 5% of the step meets it too.

The profiler slows what it records (each operator, and with ``with_stack`` the Python between
them), so a gain in the profiled trace's milliseconds is compared through its share of the
profiled step: the prediction for the unprofiled loop is that share of its measured step.

Usage:
    python benchmarks/calibration.py                 # every scenario
    python benchmarks/calibration.py --only foreach  # scenarios whose name holds "foreach"
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibration_scenarios import SCENARIOS, Loop, Scenario, busy_machine  # noqa: E402

from profcallbacks import Schedule, StepProfiler  # noqa: E402
from profcallbacks.report import build_report, locate_run  # noqa: E402

TOLERANCE = 0.30
FLOOR_MS = 1.0
NOTHING_SHARE = 0.05


@dataclass(frozen=True)
class Result:
    """One scenario's row: per-step times in ms."""

    name: str
    kind: str | None
    traced_ms: float
    traced_share: float
    basis: str
    verdict: str
    before_ms: float
    after_ms: float
    measured_ms: float
    step_after_ms: float | None = None

    @property
    def predicted_ms(self) -> float:
        """The predicted gain for the unprofiled loop: the unprofiled step less the step the
        diagnosis predicts after the fix, where it gives one from the operators' arithmetic
        (``details["step_after_ms"]``); otherwise its share of the profiled step, applied to the
        step measured without the profiler."""
        if self.step_after_ms is not None:
            return max(self.before_ms - self.step_after_ms, 0.0)
        return self.traced_share * self.before_ms

    @property
    def meets(self) -> bool:
        """Within 30% (or 1 ms) of the measured gain, or, for a fix that gains nothing (under 5%
        of the step, or slower), predicted under 5% of the step: a prediction of nothing is right
        where the fix made the step slower, however much slower."""
        if abs(self.predicted_ms - self.measured_ms) <= max(TOLERANCE * self.measured_ms,
                                                            FLOOR_MS):
            return True
        nothing = NOTHING_SHARE * self.before_ms
        return self.measured_ms < nothing and self.predicted_ms < nothing


def _predict(scenario: Scenario, logdir: Path) -> tuple[float, float, str, str, float | None]:
    """The report's gain for the scenario's kind (ms and share of the profiled step), its basis,
    the verdict, and the step it predicts after the fix (``None``: not given)."""
    loop = scenario.make(False)
    torch.set_num_threads(loop.threads)
    prof = StepProfiler(logdir, schedule=Schedule(skip_first=5, warmup=1, active=10),
                        tensorboard_scalars=False, watch_capture_file=False, sync_audit=False,
                        stall=None, slowdown=None, memory=None, baseline_capture=False)
    try:
        with prof:
            # the export helper process boots now (about a second of one core), as during a
            # real run's first steps; these loops' first steps take milliseconds, so without
            # the pause the capture would record the helper's start-up as another job on the
            # machine. Ten steps: an operator split over threads on a busy machine needs an
            # instance no thread waited in (five steps of the thread scenario had none once in
            # five runs)
            time.sleep(1.5)
            for _ in range(17):
                loop.step(next(loop.batches))
                prof.step()
    finally:
        loop.close()
    report = build_report(locate_run(logdir))
    found = {d["kind"]: d for d in report["diagnoses"]}
    verdict = report["verdict"]["kind"] if report.get("verdict") else "-"
    d = found.get(scenario.kind or "")
    if d is None:
        return 0.0, 0.0, "not diagnosed", verdict, None
    details = d.get("details") or {}
    basis = str(details.get("basis") or d["what"])
    after = details.get("step_after_ms")
    return (float(d["gain_ms"]), float(d["gain_share"]), basis, verdict,
            float(after) if isinstance(after, (int, float)) else None)


def _block(loop: Loop, steps: int) -> float:
    torch.set_num_threads(loop.threads)
    start = time.perf_counter()
    for _ in range(steps):
        loop.step(next(loop.batches))
    return (time.perf_counter() - start) / steps * 1e3


def _measure(scenario: Scenario, rounds: int, steps: int) -> tuple[float, float, float]:
    """Median block step time of the pattern and of the fix, and the median of the rounds'
    differences (pattern less fix). A scenario marked ``rebuild`` gets both loops built afresh
    each round: where its tensors lie in memory changes its step by more than the fix does."""
    loops: tuple[Loop, Loop] | None = None
    before, after = [], []
    try:
        for r in range(rounds):
            if loops is None or scenario.rebuild:
                if loops is not None:
                    for loop in loops:
                        loop.close()
                loops = (scenario.make(False), scenario.make(True))
                for loop in loops:  # warm-up: workers started, compiled, caches filled
                    _block(loop, max(steps // 2, 3))
            order = loops if r % 2 == 0 else loops[::-1]
            times = {id(loop): _block(loop, steps) for loop in order}
            before.append(times[id(loops[0])])
            after.append(times[id(loops[1])])
        diffs = [b - a for b, a in zip(before, after, strict=True)]
        return statistics.median(before), statistics.median(after), statistics.median(diffs)
    finally:
        for loop in loops or ():
            loop.close()


def run(scenario: Scenario, rounds: int = 7, steps: int = 20) -> Result:
    """Predicts and measures one scenario."""
    busy = busy_machine() if scenario.busy else contextlib.nullcontext()
    threads = torch.get_num_threads()
    try:
        with busy, tempfile.TemporaryDirectory() as tmp:
            traced, share, basis, verdict, after = _predict(scenario, Path(tmp))
            before, after_fix, measured = _measure(scenario, rounds, steps)
    finally:
        torch.set_num_threads(threads)
    return Result(scenario.name, scenario.kind, traced, share, basis, verdict, before,
                  after_fix, measured, after)


def table(results: list[Result]) -> str:
    """The results as a Markdown table."""
    rows = ["| scenario | kind | verdict | step before (ms) | after (ms) | measured gain (ms) | "
            "gain in the profiled trace (ms, share) | predicted gain (ms) | meets target |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        rows.append(f"| {r.name} | {r.kind or '-'} | {r.verdict} | {r.before_ms:.2f} | "
                    f"{r.after_ms:.2f} | {r.measured_ms:.2f} | {r.traced_ms:.2f} "
                    f"({r.traced_share:.0%}) | {r.predicted_ms:.2f} | "
                    f"{'yes' if r.meets else 'no'} |")
    return "\n".join(rows)


def machine() -> str:
    """Date and machine, for the table's heading."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}, "
            f"{cores} usable cores, load {load:.1f}, torch {torch.__version__}, "
            f"Python {platform.python_version()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run scenarios whose name holds this text")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    chosen = [s for s in SCENARIOS if args.only in s.name]
    results = []
    for scenario in chosen:
        result = run(scenario, args.rounds, args.steps)
        results.append(result)
        print(f"{result.name}: predicted {result.predicted_ms:.2f} ms ({result.basis}; "
              f"{result.traced_share:.0%} of the profiled step), measured "
              f"{result.measured_ms:.2f} ms of {result.before_ms:.2f}", flush=True)
    print()
    print(machine())
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
