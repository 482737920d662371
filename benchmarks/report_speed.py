"""`profcallbacks report --format json` against `json.load` of the same file and against HTA 0.5.0.

Two traces, written uncompressed to a temporary directory (removed afterwards unless ``--keep``):

(a) a real-shaped GPU trace of at least ``--gpu-mb`` MB, made by repeating a real trace's events
    (default: ``../shared/gpu-traces/v100_rank0_ns_resolution``, a V100 training job) with their
    timestamps shifted past the previous copy and their ids (correlation, External id, flow ids,
    Python ids) and step numbers shifted, so the copies never collide;
(b) a synthetic trace of ``--cpu-events`` small CPU events (nested ``cpu_op`` events inside
    ``ProfilerStep#N`` ranges, no ``args``).

Each measurement runs in a process of its own: its wall time (interpreter start and imports
included, for all three), its CPU time (user + system, the steadier figure on a shared machine)
and its peak RSS (``wait4``'s ``ru_maxrss``) are printed, with the ratios the targets are stated
in: the whole report no slower than ``json.load`` alone, at least 15x faster than HTA's load and
temporal breakdown, peak RSS at most 1 GB. With ``--rounds N`` each trace is measured N times,
the commands of a round in shuffled order, and the median of the rounds' ratios is printed;
``--control`` adds a second ``json.load`` to each round (bare against bare: it reads 1.00 within
the machine's noise). Smaller sizes (``--gpu-mb 80 --cpu-events 2500000``)
run in a minute or two; the report's peak RSS grows with the events it keeps.

Run:  python benchmarks/report_speed.py [--gpu-mb 300] [--cpu-events 10000000]
                                        [--hta-python /tmp/hta-venv/bin/python] [--only gpu|cpu]
                                        [--rounds 3] [--control] [--keep DIR]
HTA pins its own pandas: install it in a venv of its own
(``python3 -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install holistictraceanalysis==0.5.0``);
without ``--hta-python`` the HTA column is left out.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SOURCE = next((p / "v100_rank0_ns_resolution.pt.trace.json.gz"
               for p in (ROOT.parent / "shared" / "gpu-traces", ROOT.parent.parent / "shared" / "gpu-traces")
               if p.is_dir()), None)
ID_KEYS = ("correlation", "External id", "Python id", "Python parent id", "Ev Idx")
ID_STRIDE = 1 << 32
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def repeated_gpu_trace(source: Path, target: Path, min_bytes: float) -> tuple[int, int]:
    """Writes ``source``'s events repeated (shifted) into ``target`` until it holds ``min_bytes``;
    returns (bytes, events)."""
    trace = json.loads(gzip.decompress(source.read_bytes()))
    events = trace.pop("traceEvents")
    times = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    shift = max(times) - min(times) + 1000.0
    steps = max((int(m.group(1)) for e in events if (m := _STEP.match(str(e.get("name", ""))))),
                default=0) - min((int(m.group(1)) for e in events
                                  if (m := _STEP.match(str(e.get("name", ""))))), default=0) + 1
    one = len(json.dumps(events, separators=(",", ":")))
    copies = max(int(min_bytes / one) + 1, 1)
    written = count = 0
    with target.open("w") as out:
        head = json.dumps(trace, separators=(",", ":"))[:-1]
        out.write(head + ',"traceEvents":[')
        for k in range(copies):
            copy = [_shifted(e, k * shift, k * ID_STRIDE, k * steps) for e in events]
            text = json.dumps(copy, separators=(",", ":"))[1:-1]
            out.write(("," if k else "") + text)
            written += len(text)
            count += len(copy)
        out.write("]}")
    return target.stat().st_size, count


def _shifted(event: Any, dt: float, did: int, dstep: int) -> Any:
    if not isinstance(event, dict) or not (dt or did):
        return event
    event = dict(event)
    if isinstance(event.get("ts"), (int, float)):
        event["ts"] = event["ts"] + dt
    if isinstance(event.get("id"), int):
        event["id"] += did
    args = event.get("args")
    if isinstance(args, dict):
        event["args"] = args = dict(args)
        for key in ID_KEYS:
            if isinstance(args.get(key), int) and args[key] >= 0:
                args[key] += did
    match = _STEP.match(str(event.get("name", "")))
    if match:
        event["name"] = f"ProfilerStep#{int(match.group(1)) + dstep}"
    return event


def cpu_trace(target: Path, events: int) -> tuple[int, int]:
    """Writes ``events`` small CPU events: per step of 10,000, one ``ProfilerStep#N`` range and
    operators two deep (``aten::linear`` > ``aten::addmm``). Returns (bytes, events)."""
    per_step = 10_000
    with target.open("w") as out:
        out.write('{"schemaVersion":1,"deviceProperties":[],'
                  '"distributedInfo":{"backend":"gloo","rank":0,"world_size":1},"traceEvents":[')
        ts, written, first = 1_000_000.0, 0, True
        names = ("aten::linear", "aten::addmm", "aten::relu", "aten::add_")
        while written < events:
            n = min(per_step, events - written)
            parts = [f'{{"ph":"X","cat":"user_annotation","name":"ProfilerStep#{written // per_step}",'
                     f'"pid":1,"tid":1,"ts":{ts:.3f},"dur":{n * 2.0 + 2:.3f}}}']
            t = ts + 1
            for i in range(n - 1):
                dur = 3.0 if i % 2 == 0 else 1.0
                start = t if i % 2 == 0 else t + 0.5
                parts.append(f'{{"ph":"X","cat":"cpu_op","name":"{names[i % 4]}","pid":1,"tid":1,'
                             f'"ts":{start:.3f},"dur":{dur}}}')
                if i % 2:
                    t += 4
            out.write(("" if first else ",") + ",".join(parts))
            first = False
            written += n
            ts += n * 2.0 + 10
        out.write("]}")
    return target.stat().st_size, events


_WRAPPER = """import os, subprocess, sys, time
start = time.perf_counter()
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
_, status, usage = os.wait4(child.pid, 0)
print(time.perf_counter() - start, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status),
      usage.ru_utime + usage.ru_stime)
"""


def measured(command: list[str]) -> tuple[float, float, int, float]:
    """(wall s, peak RSS MB, exit status, CPU s) of ``command`` run to its end in a process of its
    own, started by a small process (a child forked from this one would count this one's memory).
    On a machine other work shares, the CPU seconds (user + system) are the steadier figure."""
    out = subprocess.run([sys.executable, "-c", _WRAPPER, *command], capture_output=True, text=True,
                         check=True).stdout.split()
    return float(out[0]), float(out[1]), int(out[2]), float(out[3])


def run(name: str, trace: Path, hta: Path | None, rounds: int = 1, control: bool = False) -> None:
    """Measures ``trace`` ``rounds`` times, the commands of a round in shuffled order; each
    round's ratios are of that round's figures, and their median is printed. ``control``: a
    second ``json.load`` in each round, its ratio to the first (a bare-vs-bare control: it
    should read 1.00; how far it strays is the machine's noise)."""
    size = trace.stat().st_size
    load_cmd = [sys.executable, "-c", "import json, sys; json.load(open(sys.argv[1], 'rb'))", str(trace)]
    commands = {"load": load_cmd,
                "report": [sys.executable, "-m", "profcallbacks.cli", "report", str(trace.parent),
                           "--format", "json"]}
    if control:
        commands["control"] = load_cmd
    if hta is not None:
        code = ("import sys; from hta.trace_analysis import TraceAnalysis; "
                "TraceAnalysis(trace_dir=sys.argv[1]).get_temporal_breakdown(visualize=False)")
        commands["hta"] = [str(hta), "-c", code, str(trace.parent)]
    print(f"{name}: {size / 1e6:.0f} MB")
    ratios: dict[str, list[float]] = {}
    for k in range(rounds):
        order = list(commands)
        random.shuffle(order)
        got = {key: measured(commands[key]) for key in order}
        load, report = got["load"], got["report"]
        print(f" round {k + 1} ({', '.join(order)}):")
        print(f"  json.load                          {load[0]:5.1f} s ({load[3]:5.1f} s CPU) "
              f"{load[1]:6.0f} MB peak RSS")
        print(f"  profcallbacks report --format json {report[0]:5.1f} s ({report[3]:5.1f} s CPU) "
              f"{report[1]:6.0f} MB peak RSS"
              + ("" if report[2] == 0 else f"  (exit status {report[2]})"))
        print(f"  report / json.load: {report[0] / load[0]:.2f}, in CPU seconds "
              f"{report[3] / load[3]:.2f} (target <= 1)")
        ratios.setdefault("report / json.load", []).append(report[0] / load[0])
        ratios.setdefault("report / json.load, CPU", []).append(report[3] / load[3])
        if control:
            again = got["control"]
            print(f"  json.load again (control)          {again[0]:5.1f} s ({again[3]:5.1f} s CPU): "
                  f"{again[0] / load[0]:.2f} of the first")
            ratios.setdefault("control / json.load", []).append(again[0] / load[0])
        if hta is not None:
            done = got["hta"]
            if done[2] != 0:
                print(f"  HTA 0.5.0 failed (exit status {done[2]})")
                continue
            print(f"  HTA 0.5.0 load + temporal breakdown {done[0]:5.1f} s ({done[3]:5.1f} s CPU) "
                  f"{done[1]:6.0f} MB peak RSS")
            print(f"  HTA / report: {done[0] / report[0]:.1f}x, in CPU seconds "
                  f"{done[3] / report[3]:.1f}x (target >= 15x)")
            ratios.setdefault("HTA / report", []).append(done[0] / report[0])
    if rounds > 1:
        print("  medians over the rounds: " + ", ".join(
            f"{key} {statistics.median(values):.2f}" for key, values in ratios.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--gpu-mb", type=float, default=300.0, help="size of trace (a), MB")
    parser.add_argument("--cpu-events", type=int, default=10_000_000, help="events of trace (b)")
    parser.add_argument("--source", type=Path, default=SOURCE, help="the real trace repeated in (a)")
    parser.add_argument("--hta-python", type=Path, help="python of a venv with HTA 0.5.0")
    parser.add_argument("--only", choices=("gpu", "cpu"), help="one of the two traces")
    parser.add_argument("--keep", type=Path, help="write the traces here and keep them (a trace "
                        "already there is measured again, not written again)")
    parser.add_argument("--rounds", type=int, default=1, help="measurements of each trace, "
                        "each round's commands in shuffled order")
    parser.add_argument("--control", action="store_true",
                        help="a second json.load in each round (bare-vs-bare: reads 1.00)")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="profcallbacks-bench-"))
    print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    try:
        if args.only != "cpu":
            if args.source is None or not args.source.is_file():
                sys.exit("no source trace for (a): give --source (a .pt.trace.json.gz with GPU kernels)")
            (root / "gpu").mkdir(parents=True, exist_ok=True)
            trace = root / "gpu" / "rank0_repeated.pt.trace.json"
            written = "written before"
            if not (trace.is_file() and args.keep):
                written = f"{repeated_gpu_trace(args.source, trace, args.gpu_mb * 1e6)[1]:,} events"
            run(f"(a) {args.source.name} repeated: {written}", trace, args.hta_python,
                args.rounds, args.control)
        if args.only != "gpu":
            (root / "cpu").mkdir(parents=True, exist_ok=True)
            trace = root / "cpu" / "rank0_small_events.pt.trace.json"
            if not (trace.is_file() and args.keep):
                cpu_trace(trace, args.cpu_events)
            run(f"(b) {args.cpu_events:,} small CPU events", trace, None, args.rounds, args.control)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
