"""Throughput and MFU of one capture: FLOPs per step, achieved TFLOP/s, and the share of the peak.

FLOPs come from the trace's ``flops`` arguments where torch.profiler wrote them (``with_flops=True``
in torch versions that put them in the trace), else from the recorded input shapes of matmul,
convolution and attention operators (``record_shapes=True``, the default of ``TraceOptions``; see
``flops.py``); without either there are no FLOPs and no MFU. MFU (model FLOPs
utilisation) is the achieved rate over the device's **dense** datasheet peak for the dtype the
GEMM kernels ran in (``PEAK_TFLOPS``; never the 2:4-sparsity figures, which are twice as high).
An unknown device or dtype gives no MFU unless a peak is passed (``--peak-tflops``); the
denominator is always reported next to the ratio.
"""

from __future__ import annotations

from typing import Any

from profcallbacks.report.analyse.diagnoses.model import Capture
from profcallbacks.report.analyse.diagnoses.precision import gemm_class, precision
from profcallbacks.report.model.flops import PEAK_TFLOPS, device_key

_NOTE = {"shapes": "matmul, convolution and fused-attention operators only; kernels launched "
                   "without an aten operator (compiled graphs, custom ops) are not counted, so "
                   "this is a lower bound"}


def compute_dtype(cap: Capture) -> str | None:
    """The precision most GEMM/convolution kernel time ran in (``fp32``, ``tf32``, ``bf16``,
    ``fp16``), or None without such kernels."""
    time: dict[str, float] = {}
    for k in cap.kernels:
        if gemm_class(k) is not None:
            dtype = precision(k.name)
            time[dtype] = time.get(dtype, 0.0) + k.dur
    return max(time, key=lambda d: time[d]) if time else None


def gpu_step_ms(cap: Capture) -> float | None:
    """The GPU's steady step (ms): from the start of the first GPU work launched in the steps to
    the end of the last, the cold part left out, per step; ``None`` without such work or steps."""
    if not cap.has_gpu or cap.whole_span or not cap.steps:
        return None
    first, last = cap.steps[0][0], cap.steps[-1][1]
    launched = [k for k in cap.kernels if first <= (k.launch_ts if k.launch_ts is not None
                                                    else k.ts) <= last]
    if not launched:
        return None
    span = max(k.end for k in launched) - min(k.ts for k in launched)
    return max(span / 1e3 - cap.cold_ms(), 0.0) / cap.n_steps


def throughput(cap: Capture, peak_tflops: float | None = None) -> dict[str, Any]:
    """``captures[].throughput`` of the report schema (see docs/reference/report-schema.md).

    The step is the longer of the host's and the GPU's (``step_source``): a GPU that lags the host
    sets the rate, the host only queues work ahead of it (an MI300 DDP trace's CPU step read 17%
    too fast)."""
    step_ms = cap.step_ms()
    gpu_ms = gpu_step_ms(cap)
    step_source = "gpu" if cap.has_gpu and not cap.ops else "host"  # GPU events alone: its span
    if gpu_ms is not None and gpu_ms > step_ms:
        step_ms, step_source = gpu_ms, "gpu"
    steps_per_s = 1e3 / step_ms if step_ms > 0 and not cap.whole_span else None
    flops = sum(f for ts, f in cap.flops if cap.in_steps(ts)) / cap.n_steps if cap.flops else None
    achieved = flops / (step_ms / 1e3) / 1e12 if flops and step_ms > 0 else None
    device = cap.device.name if cap.device is not None else None
    dtype = compute_dtype(cap) if cap.has_gpu else None
    key = device_key(device)
    peak, source = None, None
    if peak_tflops is not None:
        peak, source = peak_tflops, "given"
    elif key is not None and dtype is not None and dtype in PEAK_TFLOPS[key]:
        peak, source = PEAK_TFLOPS[key][dtype], f"{key} dense {dtype} datasheet peak"
    mfu = achieved / peak if achieved is not None and peak else None
    return {"step_ms": step_ms, "step_source": step_source, "steps_per_s": steps_per_s,
            "flops_per_step": flops, "flops_source": cap.flops_source if flops else None,
            "flops_note": _NOTE.get(cap.flops_source or "") if flops else None,
            "achieved_tflops": achieved, "device": device, "dtype": dtype,
            "peak_tflops": peak, "peak_source": source, "mfu": mfu}
