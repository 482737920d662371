"""Records the trace of one calibration scenario's pattern, profiled as the calibration profiles it,
for the tests' real traces (``tests/data/cpu-load``).

Usage:
    python benchmarks/calibration_traces.py busy tests/data/cpu-load/threads_busy.pt.trace.json.gz
    python benchmarks/calibration_traces.py quiet tests/data/cpu-load/threads_quiet.pt.trace.json.gz

``busy``: two intra-op threads with a CPU burner beside them on a two-core machine (the scenario
"2 threads on a busy 2-core machine -> 1"); ``quiet``: the same without the burner.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibration_scenarios import SCENARIOS, busy_machine  # noqa: E402

from profcallbacks import Schedule, StepProfiler  # noqa: E402


def record(busy: bool, out: Path) -> Path:
    """Profiles the threads scenario's pattern and copies its trace to ``out``."""
    scenario = next(s for s in SCENARIOS if "threads" in s.name and s.busy == busy)
    with (busy_machine() if busy else contextlib.nullcontext()), \
            tempfile.TemporaryDirectory() as tmp:
        loop = scenario.make(False)
        torch.set_num_threads(loop.threads)
        prof = StepProfiler(Path(tmp), schedule=Schedule(skip_first=5, warmup=1, active=5),
                            tensorboard_scalars=False, watch_capture_file=False, sync_audit=False,
                            stall=None, slowdown=None, memory=None, baseline_capture=False)
        with prof:
            for _ in range(12):
                loop.step(next(loop.batches))
                prof.step()
        trace = next(Path(tmp).rglob("*.pt.trace.json.gz"))
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(trace, out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("machine", choices=("busy", "quiet"))
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    print(record(args.machine == "busy", args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
