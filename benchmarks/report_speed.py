"""`profcallbacks report` on a large trace against HolisticTraceAnalysis loading the same file.

Generates a synthetic capture (>= 100 MB of JSON before gzip) in the shape torch.profiler and
profcallbacks write: ``ProfilerStep#N`` ranges, dataloader ``__next__`` events, nested ``cpu_op``
events with recorded shapes on a main and an autograd thread, optimizer annotations, and (by
default) CUDA runtime launches, GPU kernels and their flow events. Nothing is committed: the trace
is written to a temporary directory and removed.

Then, side by side in one process:
- gunzip + parse with the standard library's ``json``, with ``orjson``, and with ``msgspec`` into
  the report's slim records (report/read/decode.py);
- ``profcallbacks report`` (read, summarise, render text and JSON) on the log directory, and again
  without msgspec (``--no-msgspec``: the dict fallback) when asked;
- ``hta.trace_analysis.TraceAnalysis(trace_dir=...)`` on the capture directory (load only).

Run:  python benchmarks/report_speed.py [--mb 110] [--cpu-only] [--hta-python hta-venv/bin/python]
Needs: HolisticTraceAnalysis in this environment or in the venv given by --hta-python (the HTA
column is skipped, with a note, without it)
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

LAYERS = 12


def _op(name: str, ts: float, dur: float, tid: int, ext: int, dims: list[Any]) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 4242, "tid": tid, "ts": round(ts, 3),
            "dur": round(dur, 3), "args": {"External id": ext, "Sequence number": ext % 997,
                                           "Fwd thread id": 0, "Record function id": 0,
                                           "Concrete Inputs": ["", "", "", "1", "1"],
                                           "Input type": ["float", "float", "float", "Scalar", "Scalar"],
                                           "Input Strides": [[1], [1024, 1], [1, 1024], [], []],
                                           "Input Dims": dims, "Ev Idx": ext}}


class _Gen:
    def __init__(self, gpu: bool) -> None:
        self.events: list[dict[str, Any]] = []
        self.ext = 0
        self.gpu = gpu
        self.gpu_ts = 0.0
        self.rng = random.Random(0)

    def linear(self, ts: float, tid: int, name: str, dur: float) -> None:
        """A linear layer: aten::linear > (aten::t > aten::transpose > aten::as_strided), aten::addmm."""
        dims = [[1024], [64, 1024], [1024, 1024], [], []]
        ev, e = self.events, self.ext
        ev.append(_op(name, ts, dur, tid, e, dims))
        ev.append(_op("aten::t", ts + 1, 4, tid, e + 1, dims[:1]))
        ev.append(_op("aten::transpose", ts + 1.5, 3, tid, e + 2, dims[:1]))
        ev.append(_op("aten::as_strided", ts + 2, 1.5, tid, e + 3, dims[:1]))
        mm = "aten::addmm" if name == "aten::linear" else "aten::mm"
        ev.append(_op(mm, ts + 6, dur - 8, tid, e + 4, dims))
        if self.gpu:
            corr = e + 4
            launch = ts + 8
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 4242,
                       "tid": tid, "ts": launch, "dur": 5.0,
                       "args": {"External id": corr, "cbid": 211, "correlation": corr}})
            self.gpu_ts = max(self.gpu_ts, launch + 10)
            kdur = self.rng.uniform(20, 60)
            kernel = "ampere_sgemm_128x64_tn" if mm == "aten::addmm" else "ampere_sgemm_64x64_nn"
            ev.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7,
                       "ts": round(self.gpu_ts, 3), "dur": round(kdur, 3),
                       "args": {"External id": corr, "queued": 0, "device": 0, "context": 1,
                                "stream": 7, "correlation": corr, "registers per thread": 128,
                                "shared memory": 16384, "blocks per SM": 4.5, "warps per SM": 18.0,
                                "grid": [8, 16, 1], "block": [256, 1, 1],
                                "est. achieved occupancy %": 25}})
            ev.append({"ph": "s", "id": corr, "pid": 4242, "tid": tid, "ts": launch,
                       "cat": "ac2g", "name": "ac2g"})
            ev.append({"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": round(self.gpu_ts, 3),
                       "cat": "ac2g", "name": "ac2g", "bp": "e"})
            self.gpu_ts += kdur + 2
        self.ext += 5

    def step(self, n: int, ts: float) -> float:
        ev = self.events
        start = ts
        ev.append({"ph": "X", "cat": "cpu_op", "pid": 4242, "tid": 4242, "ts": ts, "dur": 800.0,
                   "name": "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
                   "args": {"External id": self.ext, "Record function id": 0, "Ev Idx": self.ext}})
        self.ext += 1
        ts += 820
        for block in range(40):  # forward: 40 blocks of LAYERS linears
            for _layer in range(LAYERS):
                self.linear(ts, 4242, "aten::linear", 30.0)
                ts += 32
            ev.append(_op("aten::relu", ts, 6, 4242, self.ext, [[64, 1024]]))
            self.ext += 1
            ts += 8 + block % 3
        bwd = ts
        for _ in range(40 * LAYERS):  # backward on the autograd thread
            ev.append(_op("autograd::engine::evaluate_function: AddmmBackward0", bwd, 40, 4343,
                          self.ext, []))
            self.ext += 1
            self.linear(bwd + 2, 4343, "AddmmBackward0", 36.0)
            bwd += 42
        ts = bwd + 10
        ev.append({"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#AdamW.step",
                   "pid": 4242, "tid": 4242, "ts": ts, "dur": 400.0,
                   "args": {"External id": self.ext, "Record function id": 0, "Ev Idx": self.ext}})
        self.ext += 1
        for i in range(100):
            ev.append(_op("aten::_foreach_add_", ts + 2 + i * 3.9, 3.5, 4242, self.ext, [[1024]]))
            self.ext += 1
        ts += 420
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 4242,
                   "tid": 4242, "ts": start - 5, "dur": ts - start + 10, "args": {"profcallbacks": True}})
        return ts + 20


def make_log_dir(root: Path, target_mb: float, gpu: bool) -> tuple[Path, int, int]:
    """Writes ``root/step000100-schedule/rank0_bench.100.pt.trace.json.gz``; returns its path,
    uncompressed size and event count."""
    gen = _Gen(gpu)
    meta = [{"ph": "M", "name": "process_name", "pid": 4242, "tid": 0, "args": {"name": "python"}},
            {"ph": "M", "name": "thread_name", "pid": 4242, "tid": 4242, "args": {"name": "main"}}]
    gen.events.extend(meta)
    ts, step = 1_000_000.0, 100
    ts = gen.step(step, ts)  # one step first, to size the rest
    step_bytes = len(json.dumps(gen.events[len(meta):], separators=(",", ":")))
    steps = max(int(target_mb * 1e6 / step_bytes) + 1, 1)
    for n in range(step + 1, step + steps):
        ts = gen.step(n, ts)
    trace = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100"}] if gpu else [],
             "record_shapes": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": 1_700_000_000_000_000_000,
             "traceEvents": gen.events,
             "distributedInfo": {"backend": "nccl" if gpu else "gloo", "rank": 0, "world_size": 1},
             "profcallbacks": {"capture": "step000100-schedule", "trigger": "schedule",
                               "first_step": step, "steps": list(range(step, step + steps)),
                               "partial": False, "rank": 0, "local_rank": 0, "world_size": 1,
                               "host": "bench"}}
    data = json.dumps(trace, separators=(",", ":")).encode()
    capture = root / "step000100-schedule"
    capture.mkdir(parents=True)
    path = capture / f"rank0_bench.{step}.pt.trace.json.gz"
    path.write_bytes(gzip.compress(data, compresslevel=1))
    return path, len(data), len(gen.events)


def _timed(fn: Any) -> tuple[float, Any]:
    gc.collect()
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--mb", type=float, default=110.0, help="uncompressed trace size (MB)")
    parser.add_argument("--cpu-only", action="store_true", help="no GPU kernels in the trace")
    parser.add_argument("--keep", type=Path, help="write the log directory here and keep it")
    parser.add_argument("--no-msgspec", action="store_true",
                        help="also time the report on its fallback path (orjson dicts, then records)")
    parser.add_argument("--hta-python", type=Path,
                        help="python of a venv with holistictraceanalysis==0.5.0 (HTA pins its own "
                             "pandas; keep it outside the repo), timed in a subprocess")
    args = parser.parse_args()

    from profcallbacks.report import build_report, decode, locate_run, render_text
    from profcallbacks.report.read.files import PARSER, gc_paused, read_bytes

    root = args.keep or Path(tempfile.mkdtemp(prefix="profcallbacks-bench-"))
    try:
        path, raw_bytes, events = make_log_dir(root, args.mb, gpu=not args.cpu_only)
        print(f"trace: {path.name}: {raw_bytes / 1e6:.0f} MB JSON, {path.stat().st_size / 1e6:.1f} MB "
              f"gzipped, {events:,} events")
        t_gunzip, data = _timed(lambda: read_bytes(path))
        parsers: dict[str, Any] = {"json": json.loads}
        try:
            import orjson

            parsers["orjson"] = orjson.loads
        except ImportError:
            print("orjson is not installed: only the standard library is timed")
        line = []
        for name, loads in parsers.items():
            t_gc, _ = _timed(lambda loads=loads: loads(data))
            with gc_paused():
                t_nogc, _ = _timed(lambda loads=loads: loads(data))
            line.append(f"{name} {t_gc:.2f} s ({t_nogc:.2f} s with gc paused)")
        if decode.DECODER == "msgspec":
            t_slim, _ = _timed(lambda: decode._decoder.decode(data))
            line.append(f"msgspec into slim records {t_slim:.2f} s")
        data = bytearray()
        print(f"gunzip {t_gunzip:.2f} s; parse: " + ", ".join(line) + "; report uses "
              + ("msgspec records" if decode.DECODER == "msgspec" else f"{PARSER} with gc paused"))

        def report() -> dict[str, Any]:
            rep = build_report(locate_run(root))
            render_text(rep)
            json.dumps(rep)
            return rep

        t_report, rep = _timed(report)
        bd = rep["breakdown"]
        print(f"profcallbacks report: {t_report:.2f} s ({bd['steps']} steps, top op "
              f"{rep['top_operators']['cpu'][0]['name']})")
        if args.no_msgspec and decode.DECODER == "msgspec":
            slim_decoder, decode._decoder = decode._decoder, None
            t_dicts, _ = _timed(report)
            decode._decoder = slim_decoder
            print(f"profcallbacks report without msgspec ({PARSER} dicts, then records): {t_dicts:.2f} s")
        verdict = rep["verdict"] or {}
        print(f"verdict: {verdict.get('kind')} ({verdict.get('share', 0):.0%}); GPU breakdown "
              f"{rep['captures'][0]['files'][0]['gpu_breakdown']}")
        if args.hta_python is not None:  # HTA pins its own pandas: it lives in a venv of its own
            code = ("import sys, time; from hta.trace_analysis import TraceAnalysis; "
                    "t = time.perf_counter(); TraceAnalysis(trace_dir=sys.argv[1]); "
                    "print(time.perf_counter() - t)")
            done = subprocess.run([str(args.hta_python), "-c", code, str(path.parent)],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                print(f"HTA failed: {done.stderr[-500:]}")
                return
            t_hta = float(done.stdout.strip().splitlines()[-1])
        else:
            try:
                from hta.trace_analysis import TraceAnalysis
            except ImportError:
                print("HolisticTraceAnalysis is not installed (pip install HolisticTraceAnalysis, "
                      "or --hta-python VENV/bin/python): no ratio")
                return
            t_hta, _ = _timed(lambda: TraceAnalysis(trace_dir=str(path.parent)))
        print(f"HTA TraceAnalysis load: {t_hta:.2f} s")
        print(f"ratio: report (verdicts included) is {t_hta / t_report:.1f}x faster than HTA's load "
              "(goal >= 8x)")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
