"""A simulated job of many ranks: `summarize`, then `report` from summaries against from traces.

The ranks' traces are made from one real rank's trace of a 4-rank gloo run
(``tests/data/gloo-traces/gloo4_rank0.pt.trace.json.gz``): each rank gets the trace with its rank,
host and per-rank jitter (0-``JITTER_MS`` more wait in each collective); two slow ranks on one host
(``node-02``: ranks 19 and 21 of 8 ranks per host) spend ``SLOW_MS`` more before each collective,
and every other rank waits that much longer in it. The report must name those two ranks and their
host as the stragglers.

Measured, each in a process of its own (wall time, peak RSS from ``wait4``):
``profcallbacks summarize --processes 2``; ``profcallbacks report --format json`` from the
summaries; the same with ``--no-summaries`` (every trace parsed). With ``--ranks 256,1024`` the
report from summaries is measured at each size: its peak RSS against the rank count, and the peak
of ``build_report`` alone (``tracemalloc``, in this process).

Run:  python benchmarks/many_ranks.py [--ranks 1024] [--repeat 4] [--processes 2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from profcallbacks.layout import summary_file_name

TEMPLATE = (Path(__file__).resolve().parent.parent / "tests" / "data" / "gloo-traces"
            / "gloo4_rank0.pt.trace.json.gz")
RANKS_PER_HOST = 8
SLOW_RANKS = (19, 21)
"""Two ranks on one host (node-02): the stragglers the report must name."""
SLOW_MS = 1.5
"""What a slow rank spends more before each collective (the others wait that much longer)."""
JITTER_MS = 0.3
CAPTURE = "step000004-schedule"
COLLECTIVE = "gloo:"


def host_of(rank: int) -> str:
    return f"node-{rank // RANKS_PER_HOST:02d}"


def _stretch(events: list[dict[str, Any]], points: list[tuple[float, float]]) -> None:
    """Insert ``d`` us of time at each ``(at_us, d)``: later events move, those that span the point
    grow."""
    points.sort()
    at = [p for p, _ in points]
    total = [0.0]
    for _, d in points:
        total.append(total[-1] + d)

    def shift(x: float) -> float:
        return total[bisect.bisect_left(at, x)]

    for e in events:
        ts = e.get("ts")
        if not isinstance(ts, (int, float)) or e.get("ph") == "M":
            continue
        if e.get("ph") == "X" and isinstance(e.get("dur"), (int, float)):
            end = ts + e["dur"]
            e["dur"] = end + shift(end) - ts - shift(ts)
        e["ts"] = ts + shift(ts)


def repeated(template: dict[str, Any], times: int) -> dict[str, Any]:
    """The template with its captured steps ``times`` times over, one copy after the other (step
    numbers continued; flow arrows kept for the first copy only): a bigger trace of the same job."""
    if times <= 1:
        return template
    events = template["traceEvents"]
    timed = [e for e in events if e.get("ph") in ("X", "i") and isinstance(e.get("ts"), (int, float))]
    lo = min(e["ts"] for e in timed)
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - lo + 100.0
    steps = [int(e["name"][len("ProfilerStep#"):]) for e in timed
             if str(e.get("name", "")).startswith("ProfilerStep#")]
    per_copy = max(steps) - min(steps) + 1
    out = list(events)
    for j in range(1, times):
        for e in timed:
            copy = dict(e, ts=e["ts"] + j * span)
            name = str(e.get("name", ""))
            if name.startswith("ProfilerStep#"):
                copy["name"] = f"ProfilerStep#{int(name[len('ProfilerStep#'):]) + j * per_copy}"
            out.append(copy)
    meta = dict(template.get("profcallbacks") or {})
    if meta.get("steps"):
        meta["steps"] = list(range(min(steps), min(steps) + per_copy * times))
    return {**template, "traceEvents": out, "profcallbacks": meta}


def rank_trace(template: dict[str, Any], rank: int, world: int, rng: random.Random,
               slow: tuple[int, ...] = SLOW_RANKS) -> dict[str, Any]:
    """The template as rank ``rank`` of ``world``: its ids, jitter, slowness."""
    trace = json.loads(json.dumps(template))
    trace["distributedInfo"] = dict(trace.get("distributedInfo") or {}, rank=rank, world_size=world)
    trace["profcallbacks"] = dict(trace.get("profcallbacks") or {}, rank=rank, world_size=world,
                                  local_rank=rank % RANKS_PER_HOST, host=host_of(rank))
    trace["host_name"] = host_of(rank)
    events = trace["traceEvents"]
    calls = sorted((e for e in events if e.get("ph") == "X"
                    and str(e.get("name", "")).startswith(COLLECTIVE)), key=lambda e: e["ts"])
    points = []
    for call in calls:
        jitter = rng.uniform(0.0, JITTER_MS) * 1e3
        if rank in slow:
            points += [(call["ts"] - 1.0, SLOW_MS * 1e3), (call["ts"] + call["dur"] / 2, jitter)]
        else:
            points.append((call["ts"] + call["dur"] / 2, SLOW_MS * 1e3 + jitter))
    _stretch(events, points)
    return trace


def simulate_job(logdir: Path, ranks: int, *, template: Path = TEMPLATE, seed: int = 0,
                 slow: tuple[int, ...] = SLOW_RANKS, repeat: int = 1) -> list[Path]:
    """Write the capture of a ``ranks``-rank job into ``logdir``; returns its trace files.
    ``repeat``: the template's steps that many times over (bigger traces)."""
    with gzip.open(template) as f:
        base = repeated(json.load(f), repeat)
    rng = random.Random(seed)
    capture = logdir / CAPTURE
    capture.mkdir(parents=True, exist_ok=True)
    out = []
    for rank in range(ranks):
        path = capture / f"rank{rank}_{host_of(rank)}.4.pt.trace.json.gz"
        data = json.dumps(rank_trace(base, rank, ranks, rng, slow), separators=(",", ":"))
        with gzip.open(path, "wb", compresslevel=1) as f:
            f.write(data.encode())
        out.append(path)
    return out


def run_child(args: list[str]) -> tuple[float, float, subprocess.CompletedProcess[bytes]]:
    """``profcallbacks ARGS`` in a fresh process: wall seconds, its own peak RSS (MiB)."""
    probe = ("import resource, runpy, sys, time; sys.argv = ['profcallbacks', *sys.argv[1:]]; "
             "t = time.perf_counter()\ntry:\n runpy.run_module('profcallbacks.cli', "
             "run_name='__main__')\nexcept SystemExit as e:\n code = e.code\nelse:\n code = 0\n"
             "print(f'@@ {time.perf_counter() - t:.4f} "
             "{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f}', file=sys.stderr)\n"
             "sys.exit(code or 0)")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True)
    wall = time.perf_counter() - start
    tail = [line for line in proc.stderr.decode().splitlines() if line.startswith("@@ ")]
    rss = float(tail[-1].split()[2]) if tail else float("nan")
    return wall, rss, proc


def report_peak_mib(logdir: Path) -> float:
    """Peak memory (MiB) of ``build_report`` from the summaries, traced in this process."""
    from profcallbacks.report import build_report, locate_run

    run = locate_run(logdir)
    tracemalloc.start()
    try:
        build_report(run)
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def stragglers(report: dict[str, Any]) -> list[tuple[int, str]]:
    job = report["captures"][0]["job"] or {}
    return [(s["rank"], s["host"]) for s in job.get("stragglers", [])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", default="1024",
                        help="rank counts, comma-separated (default 1024)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=4,
                        help="the real trace's 3 steps this many times over per rank (default 4: "
                             "12 steps, ~90 KB gzipped per rank)")
    parser.add_argument("--keep", type=Path, help="write the job here and keep it")
    args = parser.parse_args()
    sizes = [int(n) for n in args.ranks.split(",")]
    root = args.keep or Path(tempfile.mkdtemp(prefix="profcallbacks-many-ranks-"))
    try:
        for n in sizes:
            logdir = root / f"job{n}"
            shutil.rmtree(logdir, ignore_errors=True)
            t0 = time.perf_counter()
            files = simulate_job(logdir, n, repeat=args.repeat)
            made = time.perf_counter() - t0
            mib = sum(f.stat().st_size for f in files) / 2**20
            wall_s, rss_s, done = run_child(["summarize", str(logdir), "--processes",
                                             str(args.processes)])
            assert done.returncode == 0, done.stderr.decode()[-2000:]
            summary_kib = sum(f.with_name(summary_file_name(f.name)).stat().st_size
                              for f in files) / 1024
            wall_r, rss_r, fast = run_child(["report", str(logdir), "--format", "json"])
            wall_rt, rss_rt, fast_text = run_child(["report", str(logdir)])
            wall_t, rss_t, slow = run_child(["report", str(logdir), "--format", "json",
                                             "--no-summaries"])
            wall_tt, rss_tt, slow_text = run_child(["report", str(logdir), "--no-summaries"])
            a, b = json.loads(fast.stdout), json.loads(slow.stdout)
            assert fast_text.stdout == slow_text.stdout, "the text reports differ"
            print(f"{n} ranks: traces {mib:.1f} MiB gz (made in {made:.1f} s); summaries "
                  f"{summary_kib / n:.1f} KiB per rank")
            print(f"  summarize --processes {args.processes}: {wall_s:.2f} s, peak RSS "
                  f"{rss_s:.0f} MiB (parent)")
            print(f"  report (text) from summaries: {wall_rt:.2f} s, peak RSS {rss_rt:.0f} MiB; "
                  f"from traces: {wall_tt:.2f} s, {rss_tt:.0f} MiB; ratio {wall_tt / wall_rt:.1f}x")
            print(f"  report --format json from summaries: {wall_r:.2f} s, peak RSS {rss_r:.0f} "
                  f"MiB (read {a['summaries']['read']}, parsed {a['summaries']['parsed']}); from "
                  f"traces: {wall_t:.2f} s, {rss_t:.0f} MiB (parsed {b['summaries']['parsed']}); "
                  f"ratio {wall_t / wall_r:.1f}x")
            print(f"  build_report from summaries: peak {report_peak_mib(logdir):.1f} MiB (tracemalloc)")
            print(f"  stragglers: {stragglers(a)} (from traces: {stragglers(b)})")
            print(f"  job: {a['captures'][0]['job']['sentence']}")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
