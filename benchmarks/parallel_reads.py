"""`profcallbacks report` of a run of several ranks' traces: parsed ahead in worker processes
against file by file.

The run is ``--ranks`` copies of one real GPU trace (default: ``rtx2080ti_resnet_training`` of
``../shared/gpu-traces``), each a rank's foreign trace (no summaries). Each round runs, in a
shuffled order, ``report --format json --processes 1`` (file by file), the same again (the
control: it must read 1.00 against the first) and ``report --format json`` with the workers it
picks itself (``--processes`` to force a number), each a process of its own (interpreter start
and imports included). The ratios are taken round by round, then their median: the machine's
load drifts, a ratio within one round does not. The JSON reports must be equal.

Run:  python benchmarks/parallel_reads.py [--ranks 8] [--rounds 5] [--trace PATH] [--processes N]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "gpu-traces"
TRACE = SHARED / "rtx2080ti_resnet_training.pt.trace.json.gz"


def make_run(trace: Path, ranks: int, into: Path) -> Path:
    run = into / "run"
    run.mkdir()
    for rank in range(ranks):
        shutil.copyfile(trace, run / f"rank{rank}_node-{rank // 8:02d}.1.pt.trace.json.gz")
    return run


def timed(run: Path, processes: int | None) -> tuple[float, str]:
    cmd = [sys.executable, "-m", "profcallbacks.cli", "report", "--format", "json", str(run)]
    if processes is not None:
        cmd += ["--processes", str(processes)]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--processes", type=int, help="workers to force (default: the report's own choice)")
    args = parser.parse_args()
    from profcallbacks.core.cpus import usable_cpus
    from profcallbacks.report.trace_reads import workers_for

    with tempfile.TemporaryDirectory() as tmp:
        run = make_run(args.trace, args.ranks, Path(tmp))
        paths = sorted(run.iterdir())
        chosen = args.processes or workers_for(paths, summaries=True)
        print(f"{args.ranks} ranks of {args.trace.name} ({args.trace.stat().st_size / 1e6:.1f} MB "
              f"each, gzipped); {usable_cpus()} usable cores; workers: {chosen}")
        rng = random.Random(0)
        ratios: dict[str, list[float]] = {"workers": [], "control": []}
        for n in range(args.rounds):
            kinds = ["one", "control", "workers"]
            rng.shuffle(kinds)
            took: dict[str, float] = {}
            outputs: dict[str, str] = {}
            for kind in kinds:
                took[kind], outputs[kind] = timed(run, 1 if kind != "workers" else args.processes)
            assert outputs["workers"] == outputs["one"] == outputs["control"], "reports differ"
            ratios["workers"].append(took["workers"] / took["one"])
            ratios["control"].append(took["control"] / took["one"])
            print(f"round {n + 1}: " + ", ".join(f"{k} {took[k]:.2f} s" for k in kinds))
        for kind, values in ratios.items():
            print(f"{kind} / file by file: median {statistics.median(values):.2f} "
                  f"(min {min(values):.2f}, max {max(values):.2f})")


if __name__ == "__main__":
    main()
