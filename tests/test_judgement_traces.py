"""Traces that were kept out of the verdict wrongly or read wrongly, each read as an expert would.

- A 2021 ResNet-50 trace (kineto's autograd-API sample, V100, cudnn.benchmark=True): its 357
  cudaEventSynchronize calls all sit inside cuDNN convolutions of the first iteration, timing
  candidate algorithms. That is cold start, once per input shape, not a per-step sync to fix
  with .item() advice.
- A trace of GPU events alone (no CPU operators): its GPU breakdown, kernels and throughput are
  read, the GPU's span as the one step; the report refused it before.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from profcallbacks.report import build_report, locate_run
from profcallbacks.report.analyse.diagnoses.registry import diagnose
from profcallbacks.report.analyse.diagnoses.startup import autotune_ops
from profcallbacks.report.read.traces import read_trace_file

HERE = Path(__file__).parent
AUTOTUNE = HERE / "data" / "kineto-traces" / "resnet50_autograd_num_workers_0.pt.trace.json.gz"


def test_cudnn_autotune_syncs_are_cold_start_not_per_step_syncs():
    cap = read_trace_file(AUTOTUNE).capture
    assert cap is not None
    found = {d.kind: d for d in diagnose(cap)[0]}
    assert "sync_in_step" not in found  # was: cudaEventSynchronize x357 423.78 ms as step syncs
    cold = found["cold_start"]
    line = next(e for e in cold.evidence if e.startswith("cuDNN autotuning"))
    assert "cudaEventSynchronize x357" in line and "once per input shape" in line
    tuning = autotune_ops(cap)
    assert len(tuning) >= 3 and all("cudnn_convolution" in o.name for o in tuning)
    assert all(not cap.in_steps(o.ts) for o in tuning)  # left out of every steady-state rule


def test_steady_convolutions_are_not_autotuning():
    # the same model's later steps (num_workers=4 sample): cuDNN no longer syncs in convolutions
    cap = read_trace_file(HERE / "data" / "kineto-traces" /
                          "resnet50_num_workers_4.pt.trace.json.gz").capture
    assert cap is not None
    assert autotune_ops(cap) == []
    assert "cold_start" not in {d.kind for d in diagnose(cap)[0]}


ROOT = HERE.resolve().parent
SHARED = next((p for p in (ROOT.parent / "shared" / "gpu-traces",
                           ROOT.parent.parent / "shared" / "gpu-traces") if p.is_dir()), None)


@pytest.mark.skipif(SHARED is None, reason="../shared/gpu-traces is not here")
def test_a_kernels_only_trace_is_read(tmp_path):
    # the V100 trace with its GPU events alone (a capture of CUDA activity only): the report
    # refused it ("CPU operators not found"); its GPU breakdown is all a verdict needs
    assert SHARED is not None
    trace = json.loads(gzip.decompress((SHARED / "v100_rank0_ns_resolution.pt.trace.json.gz")
                                       .read_bytes()))
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("ph") == "M"
                            or e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    run = tmp_path / "run"
    run.mkdir()
    (run / "gpu_only.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps(trace).encode()))
    report = build_report(locate_run(run))
    assert not report["problems"]
    verdict = report["verdict"]
    assert verdict["kind"] == "gpu_compute_bound" and verdict["share"] > 0.95
    assert "GPU events only" in verdict["evidence"][0]
    throughput = report["captures"][0]["throughput"]
    assert throughput["step_source"] == "gpu" and throughput["step_ms"] == pytest.approx(480.0, 0.01)
    assert "fp32_compute" in {d["kind"] for d in report["diagnoses"]}  # its FP32 GEMMs are read
