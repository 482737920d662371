"""``fp32_compute``: matmuls or convolutions run in FP32 without tensor cores on a GPU that has them.

Kernel names tell precision: ``sgemm``, ``volta_sgemm_*``, ``ampere_sgemm_*``, ``scudnn``,
``implicit_convolve_sgemm``, ``gcgemm``/FFT convolutions and cuDNN ``<float, ...>`` engines are FP32
on the CUDA cores; ``tensorop``, ``s1688``/``s16816``/``h1688``/``h16816``, ``xmma``, ``tf32``,
``bf16``, ``f16`` are tensor cores. A kernel is a matmul's or a convolution's by the CPU operator
that launched it (``aten::mm``/``addmm``/``linear``/``MmBackward0`` ... against
``aten::convolution``/``ConvolutionBackward0`` ...), by its name when no operator encloses it.

Trigger: GEMM/convolution kernels in FP32 on compute capability 7.0 or higher. A class (matmuls,
convolutions) that already runs some tensor-core kernels has its precision setting on (cuDNN uses
TF32 by default on sm80+ and still picks an FP32 algorithm where that is faster): it is named as
already on tensor cores and not counted.

Fix by device: sm70/sm75 (V100, T4) have FP16 tensor cores only: FP16 autocast with a GradScaler
(TF32 and bf16 need sm80). sm80+: ``torch.set_float32_matmul_precision("high")`` (TF32 matmuls) or
bf16 autocast. Gain (a what-if): the FP32 kernels' time less that time over the device's dtype
ratio, the dense datasheet peaks of FP32 and of the precision the first fix gives (TF32 on sm80+,
FP16 on sm7x; ``model/flops.py``'s ``PEAK_TFLOPS``, printed as the basis): the most tensor cores
can speed them up, an upper bound (memory-bound GEMMs gain less). A device the table lacks keeps
the kernels' whole time, and says so.

The cost is listed when it passes 3% of the step or ``MIN_GPU_SHARE`` of the kernels' time (a
GPU idle most of the step gains little now, but these kernels are its work once the host keeps up).

Negative case: tensor-core kernels only, a GPU older than sm70, an AMD GPU (its
``computeMajor`` is a gfx generation, not a CUDA capability), or no GPU.
"""

from __future__ import annotations

import re
from functools import lru_cache

from profcallbacks.report.analyse.diagnoses.model import Capture, Diagnosis, Kernel, ms, short
from profcallbacks.report.analyse.diagnoses.whatif import gpu_time
from profcallbacks.report.model.flops import dtype_ratio

GEMM_LIKE = re.compile(r"gemm|conv|scudnn|fprop|dgrad|wgrad|xmma|cutlass|fft2d|_engine<|wgmma|"
                       r"^cijk_",
                       re.IGNORECASE)
TENSOR_CORE = re.compile(r"tensorop|s1688|s16816|h1688|h16816|h884|s884|i8816|hmma|xmma|tf32|"
                         r"bf16|f16|half|wgmma|hgemm|_fp16|bfloat", re.IGNORECASE)
_CONV_OPS = ("conv", "Conv")
_MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul",
               "aten::linear", "aten::addmv", "aten::mv", "aten::dot", "MmBackward", "AddmmBackward",
               "BmmBackward", "BaddbmmBackward", "LinearBackward", "aten::_scaled_dot_product")


@lru_cache(maxsize=4096)
def _gemm_like(name: str) -> bool:
    return GEMM_LIKE.search(name) is not None


def gemm_class(kernel: Kernel) -> str | None:
    """``"conv"``, ``"matmul"`` or None (not a GEMM/convolution kernel)."""
    if kernel.cat != "kernel" or not _gemm_like(kernel.name):
        return None
    return _gemm_class(kernel.name, kernel.ops)


@lru_cache(maxsize=1 << 16)
def _gemm_class(name: str, ops: tuple[str, ...]) -> str:
    """:func:`gemm_class` of a GEMM-like kernel ``name`` launched inside ``ops`` (a kernel's
    operators are one of a few shared chains: most calls are a look-up)."""
    for op in reversed(ops):
        if any(c in op for c in _CONV_OPS):
            return "conv"
        if any(m in op for m in _MATMUL_OPS):
            return "matmul"
    lowered = name.lower()
    return "conv" if any(c in lowered for c in ("conv", "cudnn", "fprop", "dgrad", "wgrad",
                                                  "fft2d")) else "matmul"


_AMD_TYPES = {"BBS": "bf16", "BSS": "bf16", "BB": "bf16", "HHS": "fp16", "HSS": "fp16",
              "HH": "fp16", "SS": "fp32", "S": "fp32", "DD": "fp64"}
"""rocBLAS/hipBLASLt ``Cijk_A.._B.._<types>_...`` kernels: input, output and compute types
(``BBS``: bf16 in and out, fp32 compute; ``HHS``: fp16; ``SS``: fp32)."""
_LOW_BITS = re.compile(r"mxfp4|fp4|e2m1|nvfp4")
_FP8 = re.compile(r"fp8|f8f8|e4m3|e5m2|_f8_|f8_|fnuz")


@lru_cache(maxsize=4096)
def precision(name: str) -> str:
    """``fp4``, ``fp8``, ``bf16``, ``fp16``, ``tf32`` or ``fp32`` of a GEMM/convolution kernel
    name (NVIDIA's and AMD's names)."""
    lowered = name.lower()
    if _LOW_BITS.search(lowered):
        return "fp4"
    if _FP8.search(lowered):
        return "fp8"
    if lowered.startswith("cijk_"):
        parts = name.split("_")
        kind = _AMD_TYPES.get(parts[3]) if len(parts) > 3 else None
        if kind is not None:
            return kind
    if "bf16" in lowered or "bfloat" in lowered:
        return "bf16"
    if re.search(r"h1688|h16816|h884|hgemm|f16|half|hmma", lowered):
        return "fp16"
    if TENSOR_CORE.search(lowered):
        return "tf32"
    return "fp32"


def fp32_compute(cap: Capture) -> Diagnosis | None:
    """See the module docstring."""
    device = cap.device
    if device is None or not device.nvidia or device.major < 7:
        return None
    by_class: dict[str, dict[str, float]] = {"matmul": {}, "conv": {}}
    fp32_ops: dict[str, dict[str, float]] = {"matmul": {}, "conv": {}}
    for k in cap.kernels:
        cls = gemm_class(k)
        if cls is None or not cap.in_steps(k.launch_ts if k.launch_ts is not None else k.ts):
            continue
        prec = precision(k.name)
        by_class[cls][prec] = by_class[cls].get(prec, 0.0) + k.dur
        if prec == "fp32":
            op = next((o for o in reversed(k.ops) if o.startswith("aten::") or "Backward" in o),
                      k.ops[-1] if k.ops else short(k.name, 40))
            fp32_ops[cls][op] = fp32_ops[cls].get(op, 0.0) + k.dur
    slow = [c for c in ("matmul", "conv") if by_class[c].get("fp32") and len(by_class[c]) == 1]
    if not slow:
        return None
    # kernels of several streams that overlap count once (the GPU busy union)
    cost = gpu_time(k for k in cap.kernels if gemm_class(k) in slow and precision(k.name) == "fp32"
                    and cap.in_steps(k.launch_ts if k.launch_ts is not None else k.ts))
    target = "tf32" if device.major >= 8 else "fp16"
    ratio = dtype_ratio(device.name, "fp32", target)
    if ratio is not None:
        saved = cost * (1.0 - 1.0 / ratio[0])
        basis = (f"~{saved / 1e3 / cap.n_steps:.2f} ms: FP32 GEMMs {ms(cost / cap.n_steps)} per "
                 f"step x (1 - 1/{ratio[0]:.1f}), {ratio[1]}")
        bf16 = dtype_ratio(device.name, "fp32", "bf16") if target == "tf32" else None
        if bf16 is not None:  # the other fix named: its ceiling, not its gain
            basis += f"; bf16 autocast: at most {bf16[0]:.1f}x ({bf16[1]})"
    else:
        saved = cost
        basis = (f"~{cost / 1e3 / cap.n_steps:.2f} ms: FP32 GEMMs' whole time per step (no "
                 f"{target} peak for {device.name or 'this GPU'} in the table: an upper bound)")
    gain, share = cap.per_step(saved)
    busy = gpu_time(k for k in cap.kernels if k.cat == "kernel"
                    and cap.in_steps(k.launch_ts if k.launch_ts is not None else k.ts))
    label = {"matmul": "matmuls", "conv": "convolutions"}
    evidence = [f"{label[c]}: FP32 kernels without tensor cores {ms(by_class[c]['fp32'])} "
                f"per capture" for c in slow]
    on = [c for c in ("matmul", "conv") if c not in slow and by_class[c]]
    for c in on:
        precs = ", ".join(p for p in by_class[c] if p != "fp32")
        evidence.append(f"{label[c]} already use tensor cores ({precs})")
    ops = sorted(((op, t) for c in slow for op, t in fp32_ops[c].items()), key=lambda x: -x[1])
    top_kernels = sorted({k.name for k in cap.kernels if gemm_class(k) in slow
                          and precision(k.name) == "fp32"}, key=lambda n: (len(n), n))[:2]
    evidence.append("e.g. " + ", ".join(short(n, 50) for n in top_kernels))
    evidence.append(basis)
    where = ", ".join(f"{op} {ms(t)}" for op, t in ops[:3]) or None
    name = device.name or f"a {device.capability} GPU (from kernel names)"
    what = (f"{' and '.join(label[c] for c in slow)} run in FP32 without tensor cores on "
            f"{name} ({device.capability})")
    if on:
        what += f"; {' and '.join(label[c] for c in on)} already use tensor cores"
    return Diagnosis(kind="fp32_compute", what=what, evidence=evidence, where=where,
                     gain_ms=gain, gain_share=share, fix=_fix(device.major, slow, on),
                     details={"capability": device.capability, "classes": slow, "basis": basis,
                              "fp32_ms": round(cost / 1e3 / cap.n_steps, 4),
                              "dtype_ratio": round(ratio[0], 3) if ratio else None,
                              "ratio_source": ratio[1] if ratio else None,
                              "gpu_share": round(cost / busy, 4) if busy > 0 else 0.0})


def _fix(major: int, slow: list[str], on: list[str]) -> list[str]:
    if major < 8:
        return ["Use FP16 autocast with a gradient scaler: with torch.autocast('cuda', "
                "dtype=torch.float16): ...; scaler = torch.amp.GradScaler('cuda'). On this GPU "
                "(sm7x) only FP16 uses tensor cores; TF32 and bf16 need sm80 or newer."]
    fixes = []
    if "matmul" in slow:
        fixes.append("torch.set_float32_matmul_precision('high') (TF32 matmuls"
                     + (", as the convolutions already do" if "conv" in on else "") + ")")
    if "conv" in slow:
        fixes.append("torch.backends.cudnn.allow_tf32 = True (TF32 convolutions)")
    fixes.append("or bf16 autocast: with torch.autocast('cuda', dtype=torch.bfloat16): ... "
                 "(no gradient scaler needed)")
    return fixes
