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
