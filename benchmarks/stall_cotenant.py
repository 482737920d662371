"""False stalls beside a bursty co-tenant, and how soon a real 50% data wait is flagged.

Runs the loops of ``tests/stall_scenario.py`` with the default stall detector:

- steady: ``--runs`` runs of ``--seconds`` each of a ~4 ms step with no data problem, while a
  process per core spins in bursts (0.1-0.3 s on, 0.3-1 s off); every ``dataloader_stall`` is a
  false one.
- half wait: ``--runs`` runs of a loader that sleeps as long as the step computes, alone and beside
  the co-tenant; the first ``dataloader_stall`` is the detection, given in steps and wall seconds.

``--save DIR`` writes each steady run's step times and data waits (``steady-N.json``) for replaying
through the detector with other options.

Usage:
    python benchmarks/stall_cotenant.py                      # 10 x 20 s steady, 5 x half wait
    python benchmarks/stall_cotenant.py --runs 3 --seconds 10
    PYTHONPATH=OTHER/src python benchmarks/stall_cotenant.py  # the same scenario, other code
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from stall_scenario import CoTenant, calibrate, half_wait_run, steady_run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds per steady run")
    parser.add_argument("--half-runs", type=int, default=5)
    parser.add_argument("--save", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    width = calibrate()
    print(f"width {width}; {args.runs} steady runs of {args.seconds:g} s beside the co-tenant")
    false_runs = false_total = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            with CoTenant(seed=i):
                run = steady_run(Path(tmp) / f"steady{i}", width, args.seconds)
            stalls = run.stalls()
            steps = len(run.times)
            share = sum(run.waits) / max(sum(run.times), 1e-9)
            median_ms = sorted(run.times)[steps // 2] * 1e3
            print(f"steady {i}: {steps} steps, median {median_ms:.2f} ms, wait share {share:.1%}, "
                  f"{len(stalls)} false stalls", flush=True)
            for stall in stalls:
                print(f"    step {stall.step}: {stall.message[:110]}")
            false_runs += bool(stalls)
            false_total += len(stalls)
            if args.save is not None:
                args.save.mkdir(parents=True, exist_ok=True)
                (args.save / f"steady-{i}.json").write_text(json.dumps(
                    {"times": run.times, "waits": run.waits}))
        print(f"false stalls: {false_total} in {false_runs} of {args.runs} runs\n")
        for beside in (False, True):
            for i in range(args.half_runs):
                logdir = Path(tmp) / f"half{int(beside)}-{i}"
                if beside:
                    with CoTenant(seed=100 + i):
                        run = half_wait_run(logdir, width, 30.0)
                else:
                    run = half_wait_run(logdir, width, 30.0)
                stalls = run.stalls()
                where = "beside the co-tenant" if beside else "alone"
                if not stalls:
                    print(f"half wait {where} {i}: NOT flagged in {len(run.times)} steps")
                    continue
                stall = stalls[0]
                print(f"half wait {where} {i}: flagged at step {stall.step} after "
                      f"{run.elapsed_s(stall.step):.2f} s (share {stall.details['share']:.0%}, "
                      f"from step {stall.details['first_step']})", flush=True)


if __name__ == "__main__":
    main()
