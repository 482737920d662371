"""``pageable_copy`` and ``hidden_copies``: copies that a setting or a layout would remove.

``pageable_copy``. Trigger: ``Memcpy HtoD (Pageable -> Device)`` inside the steps. A copy from
pageable memory is staged by the driver through a pinned buffer and blocks the host for its whole
length; from pinned memory with ``non_blocking=True`` it overlaps compute. Cost: per copy, the
longer of the host's ``cudaMemcpy*`` call and the copy itself. Negative case: pinned copies
(``Pinned -> Device``) only.

``hidden_copies``. Trigger: device-to-device copies and layout conversions taking at least
``HIDDEN_SHARE`` of the step: ``Memcpy DtoD`` and copy kernels launched under ``aten::copy_``,
``contiguous``, ``clone``, ``reshape`` (not a ``.to()`` to another device), and cuDNN's
``nchwToNhwc``/``nhwcToNchw`` conversions (a convolution on tensor cores wants channels_last). On
CPU-only traces (no accelerator activity at all): the time of
``aten::copy_``/``contiguous``/``clone`` outside ``.to()``. Copies under DDP's reducer are its
gradient buckets (``gradient_as_bucket_view=True`` removes them). Cost: the copies' time per step.
Negative case: copies under 5% of the step (DDP's bucket copies on the V100 trace, 1% of its step).
"""

from __future__ import annotations

from profcallbacks.report.analyse.diagnoses.model import Capture, Diagnosis, Kernel, ms, op_path, short
from profcallbacks.report.model.intervals import merge

HIDDEN_SHARE = 0.05
_COPY_OPS = ("aten::copy_", "aten::contiguous", "aten::clone", "aten::reshape", "aten::_reshape",
             "aten::permute", "aten::transpose")
_LAYOUT = ("nchwToNhwc", "nhwcToNchw")
_DEVICE_MOVES = ("aten::to", "aten::_to_copy")


def pageable_copy(cap: Capture) -> Diagnosis | None:
    """See the module docstring."""
    copies = [k for k in cap.kernels if k.cat == "gpu_memcpy" and "HtoD" in k.name
              and "Pageable" in k.name and cap.in_steps(k.launch_ts or k.ts)]
    if not copies:
        return None
    calls = {c.ts: c for c in cap.runtime if c.name.startswith("cudaMemcpy")}
    cost = 0.0
    for k in copies:
        call = calls.get(k.launch_ts) if k.launch_ts is not None else None
        cost += max(k.dur, (call.end - call.ts) if call is not None else 0.0)
    gain, share = cap.per_step(cost)
    where = _where(copies)
    pinned = sum(1 for k in cap.kernels if k.cat == "gpu_memcpy" and "Pinned -> Device" in k.name)
    evidence = [f"{len(copies)} host-to-device copies from pageable memory, {ms(cost)} "
                f"(host blocked for each)"]
    if pinned:
        evidence.append(f"{pinned} other copies already come from pinned memory")
    return Diagnosis(kind="pageable_copy", what="host-to-device copies from pageable memory",
                     evidence=evidence, where=where, gain_ms=gain, gain_share=share,
                     fix=["DataLoader(pin_memory=True) and batch.to('cuda', non_blocking=True); "
                          "for tensors made elsewhere, tensor.pin_memory() once and reuse it."],
                     details={"copies": len(copies)})


def hidden_copies(cap: Capture) -> Diagnosis | None:
    """See the module docstring."""
    if cap.has_gpu:
        found = [k for k in cap.kernels if _hidden(k) and cap.in_steps(k.launch_ts or k.ts)]
        cost = sum(e - s for s, e in merge((k.ts, k.end) for k in found))
        parts: dict[str, float] = {}
        for k in found:
            label = ("Memcpy DtoD" if "DtoD" in k.name else
                     "layout conversion " + next(x for x in _LAYOUT if x in k.name)
                     if any(x in k.name for x in _LAYOUT) else "copy kernels")
            parts[label] = parts.get(label, 0.0) + k.dur
        reducer = sum(k.dur for k in found if any("reducer" in o for o in k.ops))
        layout = any(x in k.name for k in found for x in _LAYOUT)
    elif cap.cpu_only:
        host = [o for o in cap.ops.named(lambda n: n.startswith(_COPY_OPS[:3])) if cap.in_steps(o.ts)
                and not any(p.startswith(_DEVICE_MOVES + _COPY_OPS[:3]) for p in o.parents)]
        cost = sum(e - s for s, e in merge((o.ts, o.end) for o in host))
        parts = {}
        for o in host:
            parts[o.name] = parts.get(o.name, 0.0) + o.end - o.ts
        reducer = sum(o.end - o.ts for o in host if any("reducer" in p for p in o.parents))
        layout = False
    else:  # another accelerator (MTIA ...): its copy_ calls may be device transfers
        return None
    gain, share = cap.per_step(cost)
    if share < HIDDEN_SHARE:
        return None
    fix = []
    if reducer >= cost / 2:
        fix.append("DistributedDataParallel(..., gradient_as_bucket_view=True): gradients then "
                   "live in DDP's buckets and are not copied into them each step.")
    if layout:
        fix.append("model = model.to(memory_format=torch.channels_last) and inputs "
                   ".to(memory_format=torch.channels_last): cuDNN then needs no NCHW<->NHWC "
                   "conversion around each convolution.")
    fix.append("Find the out-of-place ops and .contiguous()/.clone() calls behind the copies "
               "(the 'where' below) and use in-place or view-preserving ops.")
    top = sorted(parts.items(), key=lambda kv: -kv[1])[:3]
    what = ("device-side copies and layout conversions take a material share" if cap.has_gpu
            else "tensor copies (copy_, contiguous, clone) take a material share of the step")
    basis = f"~{gain:.2f} ms: the copies' own time per step, which in-place or view ops remove"
    return Diagnosis(kind="hidden_copies", what=what, details={"basis": basis},
                     evidence=["copies: " + ", ".join(f"{short(n, 50)} {ms(t)}" for n, t in top),
                               basis],
                     where=_where(found) if cap.has_gpu else None, gain_ms=gain,
                     gain_share=share, fix=fix)


def _hidden(k: Kernel) -> bool:
    if k.cat == "gpu_memcpy":
        return "DtoD" in k.name
    if k.cat != "kernel":
        return False
    if any(x in k.name for x in _LAYOUT):
        return True
    return "copy" in k.name and bool(k.ops) and not any(o.startswith(_DEVICE_MOVES) for o in k.ops) \
        and any(o.startswith(_COPY_OPS) for o in k.ops)


def _where(kernels: list[Kernel]) -> str | None:
    """The operators most of ``kernels`` were launched from."""
    counts: dict[str, int] = {}
    for k in kernels:
        if k.ops:
            key = op_path(k.ops) or ""
            counts[key] = counts.get(key, 0) + 1
    if not counts:
        return None
    return max(counts, key=lambda key: counts[key])
