"""FLOPs of matmul, convolution and attention operators from their recorded input shapes.

torch.profiler wrote a ``flops`` argument on these operators when recording ``with_flops=True``
up to torch 2.x; newer versions keep it out of the Chrome trace, but the shapes are there with
``record_shapes=True`` (profcallbacks' default). The formulas are those of torch's own counters:
a (batched) matmul of ``[M, K] @ [K, N]`` is ``2*M*K*N``; a convolution is ``2 * output elements *
(C_in / groups) * kernel elements``, its backward the same per gradient asked for; fused attention
``4*B*H*L*S*E`` forward and twice that backward. Only these leaf operators count (``aten::linear``
and ``aten::matmul`` call ``mm``/``addmm``/``bmm``, which do); elementwise work is left out, as in
the usual MFU definition.
"""

from __future__ import annotations

import math
import re
from typing import Any

MATMULS = {"aten::mm": 0, "aten::addmm": 1, "aten::bmm": 0, "aten::baddbmm": 1}
"""Matmul operators and where their first matrix sits in ``Input Dims``."""
ATTENTION = ("aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
             "aten::_scaled_dot_product_cudnn_attention", "aten::_flash_attention_forward",
             "aten::_efficient_attention_forward")
COUNTED = (*MATMULS, "aten::convolution", "aten::convolution_backward", *ATTENTION)


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) and v >= 0 for v in value):
        return value
    return None


def _concrete_ints(text: Any) -> list[int] | None:
    if not isinstance(text, str) or not text.startswith("["):
        return None
    try:
        return [int(v) for v in text.strip("[]").split(",") if v.strip()]
    except ValueError:
        return None


def shape_flops(name: str, dims: Any, concrete: Any) -> float | None:
    """FLOPs of one operator call from ``Input Dims`` (and ``Concrete Inputs``), or None."""
    if not isinstance(dims, list):
        return None
    if name in MATMULS:
        first = MATMULS[name]
        if len(dims) < first + 2:
            return None
        a, b = _ints(dims[first]), _ints(dims[first + 1])
        if not a or not b or len(a) < 2 or len(b) < 2:
            return None
        return 2.0 * math.prod(a) * b[-1]
    if name == "aten::convolution":
        return _conv_forward(dims, concrete)
    if name == "aten::convolution_backward":
        out, weight = (_ints(dims[0]), _ints(dims[2])) if len(dims) >= 3 else (None, None)
        if not out or not weight:
            return None
        mask = concrete[-1] if isinstance(concrete, list) and concrete else "[True, True]"
        grads = str(mask).strip("[]").split(",")[:2].count("True") if "True" in str(mask) else 2
        return 2.0 * math.prod(out) * math.prod(weight[1:]) * grads
    if name.startswith(ATTENTION):
        q, k = (_ints(dims[0]), _ints(dims[1])) if len(dims) >= 2 else (None, None)
        if not q or not k or len(q) != 4 or len(k) != 4:
            return None
        forward = 4.0 * q[0] * q[1] * q[2] * k[2] * q[3]
        return forward * (2 if name.endswith("backward") else 1)
    return None


def _conv_forward(dims: list[Any], concrete: Any) -> float | None:
    x, weight = (_ints(dims[0]), _ints(dims[1])) if len(dims) >= 2 else (None, None)
    if not x or not weight or len(x) != len(weight) or len(x) < 3:
        return None
    spatial = len(x) - 2
    params = concrete if isinstance(concrete, list) else []
    stride = _concrete_ints(params[3]) if len(params) > 3 else None
    padding = _concrete_ints(params[4]) if len(params) > 4 else None
    dilation = _concrete_ints(params[5]) if len(params) > 5 else None
    transposed = len(params) > 6 and params[6] == "True"
    if transposed:
        return None
    stride, padding, dilation = (v if v and len(v) == spatial else d for v, d in
                                 ((stride, [1] * spatial), (padding, [0] * spatial),
                                  (dilation, [1] * spatial)))
    out = [(x[2 + i] + 2 * padding[i] - dilation[i] * (weight[2 + i] - 1) - 1) // stride[i] + 1
           for i in range(spatial)]
    if any(o <= 0 for o in out):
        return None
    return 2.0 * x[0] * weight[0] * math.prod(out) * math.prod(weight[1:])


PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # dense datasheet peaks, TFLOP/s (NVIDIA and AMD data sheets; tensor-core / matrix-core
    # figures without sparsity)
    "B200": {"tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0},
    "H100 SXM": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
    "H100 PCIe": {"fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0},
    "H200": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
    "MI300X": {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
    "MI210": {"fp32": 45.3, "bf16": 181.0, "fp16": 181.0},
    "A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    "L40S": {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05},
    "L4": {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0},
    "A10": {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
    "V100 SXM2": {"fp32": 15.7, "fp16": 125.0},
    "V100 PCIe": {"fp32": 14.0, "fp16": 112.0},
    "T4": {"fp32": 8.1, "fp16": 65.0},
    "RTX 2080 Ti": {"fp32": 13.4, "fp16": 53.8},  # fp16 tensor cores, fp32 accumulate (GeForce)
    "GP100": {"fp32": 10.3, "fp16": 20.7},  # Pascal: no tensor cores
}
_MATCH = (("B200", r"\bB200\b"), ("MI300X", r"MI300X"), ("MI210", r"MI210"),
          ("RTX 2080 Ti", r"2080 ?Ti"), ("GP100", r"GP100"),
          ("H100 PCIe", r"H100.*PCIe"), ("H100 SXM", r"H100"), ("H200", r"H200"),
          ("A100", r"A100"), ("L40S", r"L40S"), ("L4", r"\bL4\b"), ("A10", r"\bA10G?\b"),
          ("V100 PCIe", r"V100.*PCIE"), ("V100 SXM2", r"V100"), ("T4", r"\bT4\b"))
"""Dense datasheet peaks (TFLOP/s) per device and dtype: the MFU denominator
(``diagnoses/throughput.py``) and the ratio a precision change can at most speed a GEMM up by
(:func:`dtype_ratio`, ``diagnoses/precision.py``)."""


def device_key(name: str | None) -> str | None:
    """The ``PEAK_TFLOPS`` row of a device name such as ``NVIDIA A100-SXM4-80GB``, or None."""
    if not name:
        return None
    for key, pattern in _MATCH:
        if re.search(pattern, name, re.IGNORECASE):
            return key
    return None


def dtype_ratio(device: str | None, slow: str, fast: str) -> tuple[float, str] | None:
    """How much faster ``fast`` GEMMs can at most run than ``slow`` ones on ``device`` (the ratio
    of their dense datasheet peaks), with the denominator in words; ``None`` where the table
    lacks the device or either dtype.

    Example:
        >>> dtype_ratio("NVIDIA A100-SXM4-40GB", "fp32", "tf32")
        (8.0, 'A100 dense fp32 19.5 -> tf32 156 TFLOP/s (datasheet peaks)')
    """
    key = device_key(device)
    row = PEAK_TFLOPS.get(key or "")
    if key is None or row is None or slow not in row or fast not in row:
        return None
    return (row[fast] / row[slow],
            f"{key} dense {slow} {row[slow]:g} -> {fast} {row[fast]:g} TFLOP/s (datasheet peaks)")
