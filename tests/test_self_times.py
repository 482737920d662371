"""An operator's self time is its duration less that of the CPU operators nested directly in it
on its thread, as ``torch.profiler``'s ``key_averages()`` has it (``read/traces.py``)."""

from __future__ import annotations

import json
import math

import torch
from torch.profiler import ProfilerActivity, profile

from profcallbacks.report.read.traces import read_trace_file


def test_self_times_equal_key_averages_of_a_recorded_profile(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(4):
            model(torch.randn(32, 64)).square().mean().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    path = tmp_path / "t.pt.trace.json"
    prof.export_chrome_trace(str(path))
    ours = read_trace_file(path).summary.cpu_ops
    theirs = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    compared = [name for name in theirs if name in ours]
    assert len(compared) >= 20
    for name in compared:  # ms against us; the trace keeps times to the nanosecond
        assert math.isclose(ours[name][1] * 1e3, theirs[name], rel_tol=1e-6, abs_tol=0.01), name


def op(name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def test_nested_operators_out_of_order_and_tied_on_two_threads(tmp_path):
    events = [
        op("A", 0.5, 10.0),
        op("D", 5.5, 1.0),  # read before B, which starts earlier
        op("C", 2.5, 1.0),
        op("B", 1.5, 3.0),
        op("E", 1.5, 0.5),  # the same start as B, shorter: inside B
        op("A", 0.5, 4.0, tid=2),
        op("B", 1.5, 1.0, tid=2),
    ]
    path = tmp_path / "t.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    ops = read_trace_file(path).summary.cpu_ops
    assert list(ops) == ["A", "B", "E", "C", "D"]  # by thread, then by start
    us = {name: [calls, round(self * 1e3, 6), round(total * 1e3, 6)]
          for name, (calls, self, total) in ops.items()}
    assert us == {"A": [2, 6.0 + 3.0, 14.0], "B": [2, 1.5 + 1.0, 4.0], "E": [1, 0.5, 0.5],
                  "C": [1, 1.0, 1.0], "D": [1, 1.0, 1.0]}
