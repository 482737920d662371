"""Traces that were kept out of the verdict wrongly or read wrongly, each read as an expert would.

- A 2021 ResNet-50 trace (kineto's autograd-API sample, V100, cudnn.benchmark=True): its 357
  cudaEventSynchronize calls all sit inside cuDNN convolutions of the first iteration, timing
  candidate algorithms. That is cold start, once per input shape, not a per-step sync to fix
  with .item() advice.
- A job whose ranks wait in collectives for two late ranks: the waiting ranks are not
  communication-bound, the late ones are the cause, and the verdict names them.
- A vLLM graph-capture trace: its launches went into a graph and did not run; it is not advised
  to use graphs.
- A trace of GPU events alone (no CPU operators): its GPU breakdown, kernels and throughput are
  read, the GPU's span as the one step; the report refused it before.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

import pytest

from profcallbacks.report import build_report, locate_run
from profcallbacks.report.analyse.diagnoses.registry import diagnose
from profcallbacks.report.analyse.diagnoses.startup import autotune_ops, graph_capture
from profcallbacks.report.read.traces import read_trace_file

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.resolve().parent / "benchmarks"))
import many_ranks  # noqa: E402

CAPTURE = HERE / "data" / "gpu-traces" / "mi300_vllm_graph_capture.pt.trace.json.gz"
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


def test_ranks_waiting_for_stragglers_are_told_so(tmp_path):
    # 24 ranks made from a real gloo rank's trace (benchmarks/many_ranks.py); ranks 19 and 21 on
    # node-02 spend 1.5 ms more before each collective: every other rank's collective time is
    # waiting for them. The verdict used to read plain communication_bound with "overlap
    # communication" advice; it now names the late ranks first.
    many_ranks.simulate_job(tmp_path / "logs", 24)
    report = build_report(locate_run(tmp_path / "logs"))
    verdict = report["verdict"]
    assert verdict["kind"] == "communication_bound"
    assert verdict["waiting_for"] == [19, 21]
    assert verdict["evidence"][0].startswith("the other ranks wait in the collectives for rank 19 "
                                             "on node-02, rank 21 on node-02")
    assert verdict["advice"][0].startswith("Find why rank 19 on node-02, rank 21 on node-02")
    assert report["captures"][0]["verdict"]["waiting_for"] == [19, 21]


def test_no_straggler_no_waiting_for(tmp_path):
    many_ranks.simulate_job(tmp_path / "logs", 8, slow=())
    verdict = build_report(locate_run(tmp_path / "logs"))["verdict"]
    assert verdict["waiting_for"] == [] and "arrive last" not in " ".join(verdict["evidence"])


def test_a_graph_capture_trace_is_not_advised_to_use_graphs(tmp_path):
    # vLLM decoding on an MI300 (TraceLens' test data): the trace records the capture of a HIP
    # graph: 428 kernel launches went into the graph, 7 kernels ran. It read host_bound with
    # "Capture the step with HIP graphs" advice; it says how the graph was built, not how it runs.
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(CAPTURE, run / CAPTURE.name)
    verdict = build_report(locate_run(run))["verdict"]
    assert verdict["evidence"][0].startswith("this trace records a CUDA/HIP graph capture: 428 "
                                             "kernel launches recorded into a graph, 7 kernels run")
    assert not any("Capture the step" in line for line in verdict["advice"])
    assert "replay the graph" in verdict["advice"][0]


@pytest.mark.skipif(SHARED is None, reason="../shared/gpu-traces is not here")
def test_traces_that_run_their_kernels_are_no_graph_capture():
    # the V100 trace calls cudaStreamGetCaptureInfo_v2 20 times, the memcpy-heavy one replays
    # graphs (cudaGraphLaunch x70), the MI300X one calls hipStreamGetCaptureInfo: all run kernels
    assert SHARED is not None
    for name in ("v100_rank0_ns_resolution", "memcpy_heavy_rank0", "mi300x_resnet18_allocator"):
        cap = read_trace_file(SHARED / f"{name}.pt.trace.json.gz").capture
        assert cap is not None and graph_capture(cap) is None, name
    cap = read_trace_file(CAPTURE).capture
    assert cap is not None and graph_capture(cap) == {"launches": 428, "executed": 7}


def test_a_capture_that_is_mostly_start_up_says_so(tmp_path):
    # HTA's AlexNet benchmark trace: 97% of it is start-up (lazy CUDA init, module loading); its
    # verdict read host_bound 99% with launch advice, as if the run were steady
    trace = HERE / "data" / "gpu-traces" / "alexnet_critical_path.pt.trace.json.gz"
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(trace, run / trace.name)
    verdict = build_report(locate_run(run))["verdict"]
    assert verdict["evidence"][0].startswith("97% of the capture (42116 ms) is one-off start-up")
    assert verdict["advice"][0].startswith("Schedule the capture past start-up")
