"""Large traces are read in pieces within bounded memory, and one beyond the limit is named."""

from __future__ import annotations

import gzip
import importlib.util
import json
import random
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from profcallbacks.report import build_report, locate_run
from profcallbacks.report.read import stream as stream_module
from profcallbacks.report.read.decode import load_trace
from profcallbacks.report.read.files import ReadError
from profcallbacks.report.read.stream import stream_trace
from profcallbacks.report.read.traces import read_trace_file, summarise, trace_model

DATA = Path(__file__).parent / "data"
BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


def write_trace(path: Path, steps: int, ops_per_step: int, *, frames_per_op: int = 6,
                spaced: bool = False) -> int:
    """A with_stack-like CPU trace: per op one ``cpu_op`` and ``frames_per_op`` Python frames,
    numbers random enough to compress like a real trace (~10x). Returns its gunzipped bytes."""
    rng = random.Random(0)
    sep = ",\n  " if spaced else ","
    written = 0
    with gzip.open(path, "wb", compresslevel=1) as f:
        def put(text: str) -> None:
            nonlocal written
            data = text.encode()
            written += len(data)
            f.write(data)

        put('{"schemaVersion": 1, "deviceProperties": [], "traceEvents": [')
        ts = 1000.0
        first = True
        for step in range(steps):
            parts = []
            start = ts
            for op in range(ops_per_step):
                dur = round(rng.uniform(5, 50), 3)
                parts.append(f'{{"ph": "X", "cat": "cpu_op", "name": "aten::op{op % 37}", "pid": 7, '
                             f'"tid": 7, "ts": {ts:.3f}, "dur": {dur}, "args": {{"External id": '
                             f'{rng.randrange(10**6)}, "Input Dims": [[{rng.randrange(512)}, 64], '
                             f'[64, {rng.randrange(512)}]], "Input type": ["float", "float"]}}}}')
                for k in range(frames_per_op):
                    parts.append(f'{{"ph": "X", "cat": "python_function", "name": "torch/nn/'
                                 f'modules/m{k}.py({rng.randrange(900)}): forward", "pid": 7, '
                                 f'"tid": 7, "ts": {ts + k * 0.1:.3f}, "dur": {dur / 2:.3f}, '
                                 f'"args": {{"Python id": {rng.randrange(10**6)}, "Python parent '
                                 f'id": {rng.randrange(10**6)}}}}}')
                ts += dur + 1.0
            parts.append(f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{step}", '
                         f'"pid": 7, "tid": 7, "ts": {start:.3f}, "dur": {ts - start:.3f}}}')
            parts.append(f'{{"ph": "f", "id": {step}, "pid": 7, "tid": 7, "ts": {ts:.3f}, '
                         f'"cat": "ac2g", "name": "ac2g"}}')
            put(("" if first else sep) + sep.join(parts))
            first = False
        put('], "traceName": "synthetic", "profcallbacks": {"rank": 0, "trigger": "schedule", '
            '"steps": [0, 1]}, "distributedInfo": {"rank": 0, "world_size": 1}}')
    return written


def same_summary(a, b) -> None:
    assert a.steps == b.steps
    assert a.cpu_ops == b.cpu_ops and a.gpu_ops == b.gpu_ops
    assert a.rank == b.rank and a.trigger == b.trigger


@pytest.mark.parametrize("spaced", [False, True], ids=["compact", "indented"])
def test_read_in_pieces_gives_the_same_summary(tmp_path, monkeypatch, spaced):
    path = tmp_path / "w.1.pt.trace.json.gz"
    write_trace(path, steps=6, ops_per_step=400, spaced=spaced)
    monkeypatch.setattr(stream_module, "_CHUNK", 4096)  # many pieces, cut at every place
    same_summary(summarise(stream_trace(path), path), summarise(load_trace(path), path))


def test_cuts_that_fall_inside_names_are_passed_over(tmp_path, monkeypatch):
    """Every event's name holds what a cut between two events looks like (``},{``, spaced too):
    the stream still reads the trace piece by piece, the same as the whole file."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
               "ts": 0.0, "dur": 1e6}]
    events += [{"ph": "X", "cat": "cpu_op", "name": f"op{i % 7}}},{{x}} , {{", "pid": 1, "tid": 1,
                "ts": 1.0 + 3 * i, "dur": 2.0} for i in range(3000)]
    path = tmp_path / "w.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    monkeypatch.setattr(stream_module, "_CHUNK", 4096)
    pieces: list[int] = []
    add = stream_module._Kept.add
    monkeypatch.setattr(stream_module._Kept, "add", lambda self, batch: (pieces.append(len(batch)),
                                                                        add(self, batch)))
    same_summary(read_trace_file(path).summary, summarise(load_trace(path), path))
    assert sum(pieces) == len(events)  # every event once
    assert len(pieces) >= path.stat().st_size // 4096  # a piece each time a chunk comes in


def test_read_in_pieces_on_traces_the_project_did_not_write(tmp_path, monkeypatch):
    monkeypatch.setattr(stream_module, "_CHUNK", 1 << 16)
    foreign = sorted(DATA.rglob("*.json.gz"))[:6] + sorted(DATA.rglob("*.json"))[:2]
    read = 0
    for path in foreign:
        try:
            whole = summarise(load_trace(path), path)
        except ReadError:
            continue  # not a trace (or broken on purpose): the other reader says so too
        same_summary(summarise(stream_trace(path), path), whole)
        read += 1
    assert read >= 3


@pytest.fixture(scope="module")
def big_run(tmp_path_factory) -> tuple[Path, int]:
    run = tmp_path_factory.mktemp("big") / "logs"
    capture = run / "step000000-schedule"
    capture.mkdir(parents=True)
    gunzipped = write_trace(capture / "rank0_host.0.pt.trace.json.gz", steps=40, ops_per_step=2500)
    return run, gunzipped


def peak_bytes(action) -> int:
    tracemalloc.start()
    try:
        action()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_large_trace_is_reported_within_bounded_memory(big_run, monkeypatch):
    run, gunzipped = big_run
    assert gunzipped > 100e6
    path = next(run.rglob("*.gz"))
    streamed = peak_bytes(lambda: stream_trace(path))
    whole = peak_bytes(lambda: load_trace(path))  # the whole-file reader, for comparison
    assert streamed < 0.5 * gunzipped, (streamed, gunzipped)  # ~100k events kept of 800k
    assert whole > gunzipped > 2 * streamed  # what reading in pieces saves
    report = build_report(locate_run(run))
    [capture] = report["captures"]
    assert capture["steps"] == list(range(40)) and not report["problems"]


def test_a_trace_beyond_the_limit_is_named_not_read(big_run, monkeypatch):
    run, _ = big_run
    monkeypatch.setattr(stream_module, "MAX_STREAM_EVENTS", 50_000)
    report = build_report(locate_run(run))
    [problem] = [p for p in report["problems"] if "beyond what the report reads" in p["error"]]
    assert "50,000 events" in problem["error"] and "Perfetto" in problem["error"]


def test_a_truncated_trace_is_named(tmp_path):
    path = tmp_path / "w.1.pt.trace.json.gz"
    write_trace(tmp_path / "full.json.gz", steps=4, ops_per_step=200)
    data = gzip.decompress((tmp_path / "full.json.gz").read_bytes())
    with gzip.open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(ReadError, match=r"ends inside its traceEvents array \(truncated\?\)"):
        stream_trace(path)
    shutil.copy(tmp_path / "full.json.gz", path)
    assert len(stream_trace(path).traceEvents) == 4 * 200 + 4  # no runtime call: no frame kept


SHARED = next((p for p in (DATA.parents[1].parent / "shared" / "gpu-traces",
                           DATA.parents[1].parent.parent / "shared" / "gpu-traces") if p.is_dir()), None)
OLD_STREAM_BYTES = 64 << 20
"""Traces this large on disk once took another reading path, without their device properties."""


def padded(source: Path, target: Path, size: int) -> None:
    """``source`` uncompressed at ``target``, grown past ``size`` bytes by metadata events that
    no report reads (placed first, so every event the report reads comes after them)."""
    trace = json.loads(gzip.decompress(source.read_bytes()))
    filler = json.dumps({"ph": "M", "name": "thread_name", "pid": 1, "tid": 1,
                         "args": {"name": "x" * 200}})
    count = size // len(filler) + 1
    events = json.dumps(trace.pop("traceEvents"))
    head = json.dumps(trace)[:-1]
    with target.open("w") as f:
        f.write(head + ', "traceEvents": [' + ",".join([filler] * count) + "," + events[1:] + "}")


@pytest.mark.parametrize("stem,folder", [("df_index_resolver", DATA / "gpu-traces"),
                                         ("h100_qwen_inference", SHARED)])
def test_a_big_trace_keeps_its_device_and_mfu(tmp_path, stem, folder):
    if folder is None or not (folder / f"{stem}.pt.trace.json.gz").is_file():
        pytest.skip(f"{stem} is absent")
    source = folder / f"{stem}.pt.trace.json.gz"
    small, big = tmp_path / "small", tmp_path / "big"
    small.mkdir(), big.mkdir()
    shutil.copy(source, small / source.name)
    padded(source, big / f"{stem}.pt.trace.json", OLD_STREAM_BYTES)
    assert (big / f"{stem}.pt.trace.json").stat().st_size > OLD_STREAM_BYTES
    reports = [build_report(locate_run(run)) for run in (small, big)]
    names = [r["run_context"]["gpu_name"] for r in reports]
    throughput = [r["captures"][0]["throughput"] for r in reports]
    assert names[0] is not None and names[0] == names[1]
    assert throughput[0]["device"] == throughput[1]["device"] == names[0]
    assert throughput[0]["mfu"] == throughput[1]["mfu"]
    assert reports[0]["captures"][0]["diagnoses"] == reports[1]["captures"][0]["diagnoses"]
    if stem == "h100_qwen_inference":
        assert throughput[1]["mfu"] > 0.1  # 12.9%: the FLOPs and the H100's peak both found


def test_the_event_limit_follows_the_memory_available(monkeypatch):
    available = stream_module.available_bytes()
    assert available is not None and available > 0  # read from /proc/meminfo here
    monkeypatch.setattr(stream_module, "available_bytes", lambda: 64 << 20)
    events, seen = stream_module.event_limit()
    assert seen == 64 << 20
    assert events == (32 << 20) // stream_module.BYTES_PER_EVENT < stream_module.MAX_STREAM_EVENTS
    monkeypatch.setattr(stream_module, "available_bytes", lambda: 1 << 50)
    assert stream_module.event_limit()[0] == stream_module.MAX_STREAM_EVENTS


def test_reading_takes_at_most_the_memory_the_limit_counts_per_event(big_run):
    run, _ = big_run
    path = next(run.rglob("*.gz"))
    kept = 40 * 2500 + 40  # operators and step ranges; 6 Python frames per operator besides
    peak = peak_bytes(lambda: read_trace_file(path))
    counted = kept // stream_module.OPERATORS_PER_EVENT + 6 * (kept - 40) // stream_module.FRAMES_PER_EVENT
    piece = 16 << 20  # one piece decoded at a time, whatever the file's size
    assert peak < counted * stream_module.BYTES_PER_EVENT + piece, (peak, (peak - piece) / counted)


def test_a_trace_beyond_the_memory_available_is_named_not_read(big_run, monkeypatch):
    run, _ = big_run
    path = next(run.rglob("*.gz"))
    monkeypatch.setattr(stream_module, "available_bytes", lambda: 40 << 20)  # 20 MiB: ~65k events
    report = build_report(locate_run(run))
    [problem] = [p for p in report["problems"] if "beyond what the report reads" in p["error"]]
    limit = (20 << 20) // stream_module.BYTES_PER_EVENT
    assert problem["file"] == str(path)
    assert f"more than {limit:,} events" in problem["error"]
    assert "of the 40 MiB available" in problem["error"] and "more memory" in problem["error"]
    assert report["captures"][0]["files"][0]["readable"] is False


def test_the_one_pass_model_equals_the_model_of_the_whole_file(monkeypatch):
    """Pieces fed one by one to the model (read_trace_file) give what the whole event list gives."""
    monkeypatch.setattr(stream_module, "_CHUNK", 1 << 15)  # many pieces
    read = 0
    for path in sorted(DATA.rglob("*.json.gz"))[:8]:
        try:
            whole = trace_model(load_trace(path), path)
        except ReadError:
            continue
        piecewise = read_trace_file(path)
        same_summary(piecewise.summary, whole.summary)
        assert piecewise.summary.format == whole.summary.format
        assert (piecewise.scan is None) == (whole.scan is None)
        if whole.scan is not None:
            assert piecewise.scan.gpu == whole.scan.gpu and piecewise.scan.steps == whole.scan.steps
            assert piecewise.scan.syncs == whole.scan.syncs
        assert (piecewise.capture is None) == (whole.capture is None)
        if whole.capture is not None:
            assert piecewise.capture.steps == whole.capture.steps
            assert ([(o.ts, o.name, o.parents) for o in piecewise.capture.ops]
                    == [(o.ts, o.name, o.parents) for o in whole.capture.ops])
            assert piecewise.capture.kernels == whole.capture.kernels
        read += 1
    assert read >= 4


def _report_peak_rss(folder: Path, events: int) -> int:
    """Peak RSS (bytes) of ``profcallbacks report --format json`` on ``events`` small CPU events
    (benchmarks/report_speed.py's trace (b)), run in a process of its own (``ru_maxrss``)."""
    spec = importlib.util.spec_from_file_location("report_speed", BENCHMARKS / "report_speed.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    folder.mkdir(parents=True)
    bench.cpu_trace(folder / "rank0_small_events.pt.trace.json", events)
    code = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
            "stdout=subprocess.DEVNULL); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "profcallbacks.cli",
                          "report", str(folder), "--format", "json"],
                         capture_output=True, text=True, check=True).stdout
    return int(out) * 1024


@pytest.mark.slow
def test_a_report_of_ten_million_small_events_stays_under_one_gb(tmp_path):
    """Measured on 2 x 10^6 events, not 10^7 (that run takes minutes on a small machine): the
    report's peak RSS per event above a run of 2 x 10^4 events, times 10^7, plus that run's, is
    under 1 GB. ``benchmarks/report_speed.py --only cpu --cpu-events 10000000`` runs 10^7
    itself (docs/explanation/cost.md has its figures)."""
    small, large = 20_000, 2_000_000
    base = _report_peak_rss(tmp_path / "small", small)
    peak = _report_peak_rss(tmp_path / "large", large)
    per_event = (peak - base) / (large - small)
    assert per_event * 10**7 + base < 1e9, (base, peak, per_event)
    assert peak < 0.3e9, peak  # 2 x 10^6 events: ~180 MB


def test_the_rows_in_steps_are_those_in_steps_keeps():
    """``Capture.rows_in_steps`` (a bisection per step where the operator table is in start order)
    selects exactly the rows ``Capture.in_steps`` keeps, with and without a cold part."""
    checked = 0
    for path in sorted(DATA.rglob("*.json.gz"))[:12]:
        try:
            cap = read_trace_file(path).capture
        except ReadError:
            continue
        if cap is None or not cap.ops:
            continue
        for cold in ([], [(cap.steps[0][0], cap.steps[0][0] + 10.0)]):
            cap.cold = cold
            assert list(cap.rows_in_steps()) == [
                i for i, ts in enumerate(cap.ops.ts) if cap.in_steps(ts)], path
        checked += 1
    assert checked >= 5
