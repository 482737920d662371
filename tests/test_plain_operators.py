"""The plain CPU operators read in one walk give the model that each part's own walk gives.

``read/plain_operators.py`` takes the common operator into the summary, the scan, the capture model
and the normaliser's counts at once, and hands every other event to the parts run by run. The model
must not depend on which way an event went: each test reads the same events both ways (the
one-walk reader switched off: ``ModelBuilder.plain = None``) and compares everything the analyses
read.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import msgspec
import pytest

from profcallbacks.report.read.decode import Args, Event, decode_trace
from profcallbacks.report.read.files import ReadError
from profcallbacks.report.read.stream import _Kept, stream_trace
from profcallbacks.report.read.traces import ModelBuilder, TraceModel

HERE = Path(__file__).parent
TRACES = sorted(HERE.glob("data/*-traces/*.pt.trace.json.gz"))
PATH = Path("t.json")


def read(events: list[Any], *, one_walk: bool, pieces: int = 1, sifted: bool = False) -> TraceModel:
    """The model of ``events``, fed in ``pieces`` pieces, the plain operators in one walk or not;
    ``sifted``: as the streamed reader feeds a piece as decoded (``ModelBuilder.sift``)."""
    builder = ModelBuilder(PATH)
    if not one_walk:
        builder.plain = None
    kept = _Kept(PATH, 10**9, take=builder.add, sift=builder.sift)
    size = -(-len(events) // pieces) or 1
    for start in range(0, len(events), size):
        (kept.add if sifted else builder.add)(events[start:start + size])
    if sifted:
        kept.finish()
    return builder.finish(decode_trace(b'{"traceEvents": []}', PATH))


def comparable(model: TraceModel) -> dict[str, Any]:
    """Everything the analyses read of ``model``, as plain data."""
    summary = asdict(model.summary)
    scan = asdict(model.scan) if model.scan is not None else None
    cap = model.capture
    capture = None if cap is None else {
        "steps": cap.steps, "flops": cap.flops, "source": cap.flops_source,
        "ops": [(o.ts, o.end, o.name, o.tid, o.parents) for o in cap.ops],
        "runtime": [(o.ts, o.end, o.name, o.tid, o.parents) for o in cap.runtime],
        "kernels": [msgspec.structs.asdict(k) for k in cap.kernels],
        "frames": {t: [(f.ts, f.end, f.name) for f in fs] for t, fs in cap.frames.items()},
        "device": cap.device, "cpu_only": cap.cpu_only, "whole": cap.whole_span}
    return {"summary": summary, "scan": scan, "capture": capture, "failure": model.failure}


def events_of(path: Path) -> list[Any]:
    """``path``'s events as the streamed reader keeps them (its pieces, in file order)."""
    kept: list[Any] = []
    stream_trace(path, take=kept.extend)
    return kept


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name.split(".")[0])
def test_real_traces_read_the_same_either_way(path):
    one_walk = read(events_of(path), one_walk=True, pieces=7)  # read twice: the reader rewrites
    assert comparable(one_walk) == comparable(read(events_of(path), one_walk=False))  # in place


def op(name: str, ts: Any, dur: Any, tid: Any = 1, **args: Any) -> Event:
    return Event(ph="X", cat="cpu_op", name=name, pid=7, tid=tid, ts=ts, dur=dur,
                 args=Args(**args) if args else msgspec.UNSET)


def mixed() -> list[Any]:
    """Plain operators interleaved with every kind of event the parts treat on their own: the
    first of each name and thread, ties at one start, two threads, a blocking call, a compiled
    region, a loader fetch, a step range, shapes that give FLOPs, the trace's own FLOPs, whole
    microseconds, a missing duration, hostile thread ids, a kernel and a launch."""
    step = Event(ph="X", cat="user_annotation", name="ProfilerStep#3", pid=7, tid=1, ts=0.0,
                 dur=500.0, args=Args(profcallbacks=True))
    out: list[Any] = [step]
    for k in range(4):
        base = 10.0 + 100 * k
        out += [
            op("aten::linear", base, 20.5),
            op("aten::addmm", base + 1, 19.0, dims=msgspec.Raw(b"[[4, 8], [4, 8], [8, 8]]")),
            op("aten::t", base + 1, 19.0),  # the same start and duration as addmm: a tie
            op("aten::relu", base + 30, 5.0, tid=2),
            op("aten::item", base + 40, 1.0),
            op("Torch-Compiled Region", base + 45, 3.0),
            op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", base + 50, 4.0),
            op("aten::mm", base + 60, 2.0, flops=64),
            op("aten::relu", base + 70, 1.0),
            op("aten::add_", int(base) + 80, 2),  # whole microseconds
            op("aten::zero_", base + 85, msgspec.UNSET),
            op("aten::relu", base + 88, 1.0, tid=[3]),
            Event(ph="X", cat="python_function", name="train.py(12): step", pid=7, tid=1,
                  ts=base + 1.5, dur=2.0),
            Event(ph="X", cat="cuda_runtime", name="cudaLaunchKernel", pid=7, tid=1,
                  ts=base + 2, dur=1.0, args=Args(correlation=k + 1)),
            Event(ph="s", cat="ac2g", name="ac2g", pid=7, tid=1, ts=base + 2),
            Event(ph="X", cat="kernel", name="sgemm", pid=0, tid=7, ts=base + 5, dur=9.0,
                  args=Args(stream=7, correlation=k + 1)),
            Event(ph="X", cat="cuda_runtime", name="cudaMemsetAsync", pid=7, tid=[4],
                  ts=base + 6, dur=1.0),
            op("aten::relu", base + 90.25, 0.5),
        ]
    return out


@pytest.mark.parametrize("sifted", [False, True], ids=["kept", "sifted"])
@pytest.mark.parametrize("pieces", [1, 3, 60])
def test_a_mix_of_every_kind_reads_the_same_either_way(pieces, sifted):
    one_walk = read(mixed(), one_walk=True, pieces=pieces, sifted=sifted)
    general = read(mixed(), one_walk=False, sifted=sifted)
    assert comparable(one_walk) == comparable(general)
    summary = one_walk.summary
    assert summary.cpu_ops["aten::relu"][0] == 16  # tid [3] is a thread of its own, kept
    assert summary.format.cpu_ops == general.summary.format.cpu_ops > 0
    assert summary.format.ns_resolution
    assert one_walk.capture is not None and one_walk.capture.flops_source == "with_flops"
    assert len(one_walk.capture.runtime) == 8  # the list-keyed thread's calls too
    assert sum(map(len, one_walk.capture.frames.values())) == 4  # a frame around each launch


def test_plain_operators_skip_the_parts_own_walks(monkeypatch):
    """The walk is one: a piece of plain operators reaches no part's own ``add`` past the first
    of each name."""
    events = [op("aten::relu", float(10 * i), 5.0) for i in range(1000)]
    builder = ModelBuilder(PATH)
    seen: list[int] = []
    general = builder._add_each
    monkeypatch.setattr(builder, "_add_each", lambda run: (seen.append(len(run)), general(run)))
    builder.add(events)
    assert sum(seen) == 1
    assert builder.finish(decode_trace(b'{"traceEvents": []}', PATH)).summary.cpu_ops["aten::relu"][0] == 1000



def read_file(path: Path, *, one_walk: bool, max_events: int | None = None) -> TraceModel:
    """``path`` streamed as ``read_trace_file`` reads it (each piece through the sift, as
    decoded), the plain operators in one walk or not."""
    builder = ModelBuilder(path)
    if not one_walk:
        builder.plain = None
    return builder.finish(stream_trace(path, take=builder.add, sift=builder.sift,
                                       max_events=max_events))


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name.split(".")[0])
def test_trace_files_sifted_as_decoded_read_as_each_part_reads_them(path):
    assert comparable(read_file(path, one_walk=True)) == comparable(read_file(path, one_walk=False))


def smallest_limit(path: Path, *, one_walk: bool) -> int:
    """The fewest events ``max_events`` may allow for ``path`` to be read."""
    low, high = 0, 1 << 20  # read at high, refused at low
    while high - low > 1:
        mid = (low + high) // 2
        try:
            read_file(path, one_walk=one_walk, max_events=mid)
        except ReadError:
            low = mid
        else:
            high = mid
    return high


def test_the_operators_a_sift_takes_count_against_the_event_limit_as_kept_ones():
    path = HERE / "data" / "gpu-traces" / "mi300_vllm_graph_capture.pt.trace.json.gz"  # 3,777 plain
    assert smallest_limit(path, one_walk=True) == smallest_limit(path, one_walk=False) > 1000


def test_shapes_kept_from_a_decoded_piece_let_the_piece_go():
    """An operator's shapes are kept for its FLOPs; taken from the piece as decoded they are
    copies, not views that would hold the whole piece in memory."""
    data = msgspec.json.encode([
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 7, "tid": 1, "ts": 10.0 * i,
         "dur": 5.0, "args": {"Input Dims": [[4, 8], [8, 8]], "Concrete Inputs": ["", ""]}}
        for i in range(50)])
    before = sys.getrefcount(data)
    piece = msgspec.json.decode(data, type=list[Event])
    assert sys.getrefcount(data) > before  # the shapes are views of ``data``
    builder = ModelBuilder(PATH)
    assert builder.sift(piece, _Kept(PATH, 10**6).keep) == 49  # the first of a name: the general way
    assert len(builder.capture.shaped) == 50
    del piece
    assert sys.getrefcount(data) == before
