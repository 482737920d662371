"""Computes HTA 0.5.0's critical path per step of the real GPU traces, the reference the report's
critical path (``report/analyse/critical_path.py``) is checked against in
``tests/test_critical_path.py`` (``tests/data/hta_critical_path.json``).

HTA pins its own pandas: run this with a virtualenv of its own, never the project's::

    python3 -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install holistictraceanalysis==0.5.0
    /tmp/hta-venv/bin/python benchmarks/calibration_hta_path.py \\
        tests/data/hta_critical_path.json ../shared/gpu-traces/*.pt.trace.json.gz \\
        tests/data/gpu-traces/*.pt.trace.json.gz

Each trace is analysed alone in a directory of its own: ``TraceAnalysis(trace_dir=D)``, then
``critical_path_analysis(rank, annotation="ProfilerStep", instance_id=i)`` for each step ``i``.
The step's path length is the sum of the path's edge weights (us); ``bound_by`` sums them by HTA's
classes (``cpu_bound``, ``gpu_compute_bound``, ``gpu_kernel_kernel_overhead``,
``gpu_kernel_launch_overhead``). A trace HTA cannot read, or a step whose analysis fails, is
recorded with the reason.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any


def _steps(trace_path: Path) -> list[str]:
    import gzip

    opener = gzip.open if trace_path.suffix == ".gz" else open
    with opener(trace_path, "rt") as f:
        trace = json.load(f)
    names = [e["name"] for e in trace.get("traceEvents", [])
             if isinstance(e, dict) and str(e.get("name", "")).startswith("ProfilerStep#")
             and e.get("ph") == "X"]
    return sorted(set(names), key=lambda n: int(n.split("#")[1]))


def analyse(trace_path: Path) -> dict[str, Any]:
    """HTA's critical path of each ``ProfilerStep`` of one trace."""
    from hta.trace_analysis import TraceAnalysis

    steps = _steps(trace_path)
    if not steps:
        return {"error": "no ProfilerStep annotation"}
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copyfile(trace_path, Path(tmp) / trace_path.name)
        try:
            analysis = TraceAnalysis(trace_dir=tmp)
        except Exception as exc:  # HTA cannot read it
            return {"error": f"{type(exc).__name__}: {exc}"[:300]}
        rank = next(iter(analysis.t.traces))
        out: dict[str, Any] = {"rank": int(rank), "steps": {}}
        for i, name in enumerate(steps):
            try:
                graph, ok = analysis.critical_path_analysis(rank, "ProfilerStep", i)
                frame = graph.get_critical_path_breakdown() if ok else None
            except Exception as exc:  # one step's graph is invalid (cycles, negative weights)
                out["steps"][name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                continue
            if frame is None:
                out["steps"][name] = {"error": "no critical path"}
                continue
            bound = frame.groupby("bound_by")["duration"].sum()
            out["steps"][name] = {"length_us": round(float(frame["duration"].sum()), 3),
                                  "bound_by": {str(k): round(float(v), 3)
                                               for k, v in bound.items()}}
        return out


def main(argv: list[str]) -> int:
    out, traces = Path(argv[0]), [Path(p) for p in argv[1:]]
    import hta

    result: dict[str, Any] = {"hta": getattr(hta, "__version__", "0.5.0"), "traces": {}}
    for path in traces:
        name = path.name.split(".")[0]
        if name in result["traces"]:
            continue
        print(name, flush=True)
        result["traces"][name] = analyse(path)
    out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
