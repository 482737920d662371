"""The report's trace decoding: msgspec's slim records and the dict fallback agree, numbers included."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from profcallbacks.report import build_report, locate_run
from profcallbacks.report.read import decode
from profcallbacks.report.read.files import ReadError

GPU_TRACES = Path(__file__).parent / "data" / "gpu-traces"
STEP = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 1, "tid": 1, "ts": 0,
        "dur": 500, "args": {"profcallbacks": True}}
OP = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.5, "dur": 5,
      "args": {"External id": 3, "Input Dims": [[64, 1024], [1024, 1024]], "Concrete Inputs": ["", ""]}}
KERNEL = {"ph": "X", "cat": "kernel", "name": "sgemm", "pid": 0, "tid": 7, "ts": 20, "dur": 40,
          "args": {"stream": 7, "correlation": 3, "grid": [8, 16, 1]}}
LAUNCH = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 12,
          "dur": 4, "args": {"correlation": 3}}
HOSTILE = [42, "x", None, [1], {"ph": "X", "args": [1, 2]}, {**OP, "dur": None}, {**OP, "ts": 1e300},
           {**OP, "name": None}, {**OP, "pid": [1]}, {**OP, "cat": None}, {"ph": "X", "cat": "cpu_op"},
           {**KERNEL, "args": {"stream": "7", "correlation": [3]}}, {**KERNEL, "args": "x"},
           {**STEP, "name": "ProfilerStep#8", "ts": 600, "args": {"profcallbacks": [1]}},
           {"ph": "f", "id": 3, "ts": 20, "cat": "ac2g", "name": "ac2g", "bp": "e"}]


def _write(path: Path, events: list) -> Path:
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events,
                                               "distributedInfo": {"rank": 3}}).encode()))
    return path


def test_only_the_fields_the_report_reads_are_kept(tmp_path):
    trace = decode.load_trace(_write(tmp_path / "t.json.gz", [OP, KERNEL]))
    op, kernel = trace.traceEvents
    assert (op.name, op.ts, op.dur, op.pid, op.tid) == ("aten::mm", 10.5, 5, 1, 1)
    assert not hasattr(op.args, "Input Dims") and not hasattr(op, "id")  # the bulk is skipped
    assert (kernel.args.stream, kernel.args.correlation) == (7, 3)
    assert op.args.stream == -1 and trace.distributedInfo == {"rank": 3}


def test_a_missing_field_is_not_a_null_one(tmp_path):
    no_dur = {k: v for k, v in OP.items() if k != "dur"}  # a missing dur is 0, a null one a fault
    no_name = {k: v for k, v in OP.items() if k != "name"}  # a missing name is ""
    trace = decode.load_trace(_write(tmp_path / "t.json.gz", [no_dur, {**OP, "dur": None}]))
    missing, null = trace.traceEvents
    assert missing.dur is decode.MISSING and null.dur is None
    path = _write(tmp_path / "rank0_h.pt.trace.json.gz", [STEP, no_dur, no_name, {**OP, "dur": None}])
    report = build_report(locate_run(path))
    assert any("skipped 1 malformed event(s)" in p["error"] for p in report["problems"])
    assert sorted(op["name"] for op in report["top_operators"]["cpu"]) == ["", "aten::mm"]


def _shapes_decoded(events: list) -> list:
    """The events with operator shapes decoded (kept as undecoded JSON, whose spacing differs)."""
    out = []
    for e in events:
        if isinstance(e, decode.Event) and isinstance(e.args, decode.Args):
            args = e.args
            e = (e.ph, e.cat, e.name, e.pid, e.tid, e.ts, e.dur, args.stream, args.correlation,
                 args.profcallbacks, args.flops, decode.shape_value(args.dims),
                 decode.shape_value(args.concrete))
        out.append(e)
    return out


def test_fast_and_dict_paths_give_the_same_records(tmp_path, monkeypatch):
    path = _write(tmp_path / "t.json.gz", [STEP, OP, KERNEL, LAUNCH, *HOSTILE])
    fast = decode.load_trace(path)
    monkeypatch.setattr(decode, "_decoder", None)
    slow = decode.load_trace(path)
    assert _shapes_decoded(fast.traceEvents) == _shapes_decoded(slow.traceEvents)
    assert fast.distributedInfo == slow.distributedInfo == {"rank": 3}


@pytest.mark.parametrize("content", [b"[1, 2]", b'{"traceEvents": 5}', b"{"])
def test_not_a_trace_is_a_read_error_either_way(tmp_path, content, monkeypatch):
    path = tmp_path / "t.json"
    path.write_bytes(content)
    with pytest.raises(ReadError):
        decode.load_trace(path)
    monkeypatch.setattr(decode, "_decoder", None)
    with pytest.raises(ReadError):
        decode.load_trace(path)


def _reports(path: Path, monkeypatch) -> tuple[dict, dict]:
    fast = build_report(locate_run(path))
    monkeypatch.setattr(decode, "_decoder", None)
    return fast, build_report(locate_run(path))


@pytest.mark.parametrize("name", ["sampled_rank0", "alexnet_critical_path"])
def test_every_number_identical_without_msgspec_on_real_gpu_traces(name, monkeypatch):
    fast, slow = _reports(GPU_TRACES / f"{name}.pt.trace.json.gz", monkeypatch)
    assert fast["captures"][0]["files"][0]["gpu_breakdown"] is not None
    assert json.dumps(fast, sort_keys=True) == json.dumps(slow, sort_keys=True)


def test_every_number_and_problem_identical_without_msgspec_on_hostile_events(tmp_path, monkeypatch):
    huge = {**OP, "ts": 10**30}  # an int beyond 64 bits: orjson makes it a float, msgspec an int
    path = _write(tmp_path / "rank0_h.pt.trace.json.gz", [STEP, OP, KERNEL, LAUNCH, *HOSTILE, huge])
    fast, slow = _reports(path, monkeypatch)
    assert json.dumps(fast, sort_keys=True) == json.dumps(slow, sort_keys=True)
    assert any("malformed event" in p["error"] for p in fast["problems"])
    assert fast["captures"][0]["steps"] == [7, 8]


def test_blank_file_longer_than_the_first_block_is_empty(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(b" " * 10_000)
    with pytest.raises(ReadError, match="empty file"):
        decode.load_trace(path)
    path.write_bytes(b" " * 10_000 + b'{"traceEvents": []}')
    assert decode.load_trace(path).traceEvents == []


def test_gpu_events_without_name_or_category_are_skipped(tmp_path):
    good = [STEP, OP, LAUNCH, KERNEL]
    no_cat = {k: v for k, v in KERNEL.items() if k != "cat"} | {"ts": 300}  # not GPU work
    no_name = {k: v for k, v in KERNEL.items() if k != "name"} | {"ts": 200}  # named as a fault
    clean = build_report(locate_run(_write(tmp_path / "rank0_a.pt.trace.json.gz", good)))
    (tmp_path / "b").mkdir()
    report = build_report(locate_run(_write(tmp_path / "b" / "rank0_b.pt.trace.json.gz",
                                            [*good, no_cat, no_name])))
    breakdown = report["captures"][0]["files"][0]["gpu_breakdown"]
    assert breakdown is not None and breakdown == clean["captures"][0]["files"][0]["gpu_breakdown"]
    assert any("skipped 1 event(s) with a missing" in p["error"] for p in report["problems"])
