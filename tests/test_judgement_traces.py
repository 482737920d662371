"""Traces that were kept out of the verdict wrongly or read wrongly, each read as an expert would.

- A 2021 ResNet-50 trace (kineto's autograd-API sample, V100, cudnn.benchmark=True): its 357
  cudaEventSynchronize calls all sit inside cuDNN convolutions of the first iteration, timing
  candidate algorithms. That is cold start, once per input shape, not a per-step sync to fix
  with .item() advice.
"""

from __future__ import annotations

from pathlib import Path

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
