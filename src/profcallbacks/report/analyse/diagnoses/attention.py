"""``attention_math_fallback``: attention computed the slow way, where a fused kernel would run.

Trigger (either):

- ``aten::_scaled_dot_product_attention_math`` inside the steps: ``scaled_dot_product_attention``
  fell back to its math backend (several kernels and the full attention matrix in memory) because
  no fused backend accepted the inputs: on CUDA, flash attention needs fp16/bf16 inputs, a head
  dimension up to 256 (a multiple of 8) and no arbitrary ``attn_mask``; memory-efficient attention
  takes fp32 but not every mask or dropout; an explicit ``sdpa_kernel(SDPBackend.MATH)`` forces it;
- hand-written attention: ``matmul``/``bmm``, at most two scaling/masking/cast operators, a
  ``softmax``, at most a dropout and a cast (Hugging Face's eager attention: ``bmm -> softmax ->
  dropout -> to -> bmm``, no SDPA operator), and a second ``matmul``/``bmm``, siblings under the
  same parent, outside ``scaled_dot_product_attention``; a chain that alternates softmax and
  matmul (``softmax(w) @ x`` repeated, a weighted sum: the sampled trace's ``fb::convex_sum``)
  is not attention.

Cost: the time of those operators (their kernels' time on a GPU) per step: an upper bound, the
fused kernel still takes some. Negative case: the flash or memory-efficient backend
(``_scaled_dot_product_flash_attention``, ``_efficient_attention``, ``..._for_cpu``).
"""

from __future__ import annotations

from profcallbacks.report.analyse.diagnoses.model import Capture, Diagnosis, Op, ms, short
from profcallbacks.report.analyse.diagnoses.precision import precision
from profcallbacks.report.analyse.diagnoses.whatif import gpu_time

MATH = "aten::_scaled_dot_product_attention_math"
_MATMULS = ("aten::matmul", "aten::bmm", "aten::baddbmm", "aten::einsum")
_SOFTMAX = ("aten::softmax", "aten::_softmax", "aten::_safe_softmax")
_BETWEEN = ("aten::mul", "aten::div", "aten::add", "aten::masked_fill", "aten::where",
            "aten::dropout", "aten::to", "aten::_to_copy", "aten::transpose", "aten::t")


def attention_math_fallback(cap: Capture) -> Diagnosis | None:
    """See the module docstring."""
    math_ops = [o for o in cap.ops.named(lambda n: n == MATH) if cap.in_steps(o.ts)
                and MATH not in o.parents]
    hand = [] if math_ops else _hand_written(cap)
    found = math_ops or hand
    if not found:
        return None
    kernels = [k for k in cap.kernels if k.launch_ts is not None and any(
        o.ts <= k.launch_ts <= o.end for o in found)] if cap.has_gpu else []
    cost = gpu_time(kernels) if kernels else sum(o.end - o.ts for o in found)
    gain, share = cap.per_step(cost)
    why = []
    if kernels and all(precision(k.name) == "fp32" for k in kernels if "gemm" in k.name.lower()):
        why.append("the inputs are float32 (flash attention needs fp16/bf16)")
    why.append("an attn_mask tensor, a head dim over 256 or not a multiple of 8, or "
               "sdpa_kernel(SDPBackend.MATH) also rule out the fused kernels" if cap.has_gpu else
               "an attn_mask tensor, dropout or sdpa_kernel(SDPBackend.MATH) rule out the fused "
               "CPU kernel")
    per_call = len(kernels) / len(found) if kernels else None
    evidence = [f"{len(found)} attention call(s) " + ("on SDPA's math backend" if math_ops else
                                                      "written as matmul-softmax-matmul")
                + f", {ms(cost)}" + (f", {per_call:.0f} kernels each" if per_call else "")]
    what = ("scaled_dot_product_attention fell back to its math backend" if math_ops
            else "attention is written by hand (matmul, softmax, matmul), not fused")
    fix = (["Run attention in bf16/fp16 (autocast) and pass is_causal=True instead of a causal "
            "attn_mask, so the flash / memory-efficient kernels take it."] if cap.has_gpu else
           ["Pass is_causal=True instead of a causal attn_mask (and no dropout in eval), so "
            "SDPA takes its fused CPU kernel."])
    if not math_ops:
        fix.insert(0, "Call torch.nn.functional.scaled_dot_product_attention(q, k, v, ...) "
                      "instead of softmax(q @ k.transpose(-2, -1) * scale) @ v.")
    where = " > ".join(found[0].parents[-2:]) or found[0].name
    return Diagnosis(kind="attention_math_fallback", what=what,
                     evidence=evidence + ["likely why: " + "; ".join(why)],
                     where=short(where, 100), gain_ms=gain, gain_share=share, fix=fix)


def _matmul_at(items: list[Op], positions: range) -> int | None:
    """The first matmul among ``items[positions]``, passing only the ops attention puts between
    its matmuls and its softmax (scaling, masking, dropout, casts)."""
    for j in positions:
        name = items[j].name
        if name.startswith(_MATMULS):
            return j
        if not name.startswith(_BETWEEN):
            return None
    return None


def _hand_written(cap: Capture) -> list[Op]:
    """Spans from a matmul through a softmax to the next matmul among siblings."""
    ops = cap.ops
    wanted = {(ops.tid[i], ops.parent[i]) for i in ops.rows_named(lambda n: n.startswith(_SOFTMAX))}
    if not wanted:
        return []
    siblings: dict[tuple[int, int], list[Op]] = {}  # (thread, parents' chain) -> operators
    for i, key in enumerate(zip(ops.tid, ops.parent, strict=True)):
        if key not in wanted:
            continue
        o = ops.op(i)
        if o.name.startswith(("aten::scaled_dot_product", "aten::_scaled_dot_product")):
            continue
        if any("scaled_dot_product" in p for p in o.parents) or not cap.in_steps(o.ts):
            continue
        siblings.setdefault(key, []).append(o)
    out = []
    for items in siblings.values():
        items.sort(key=lambda o: o.ts)
        for i, o in enumerate(items):
            if not o.name.startswith(_SOFTMAX):
                continue
            first = _matmul_at(items, range(i - 1, max(i - 4, -1), -1))
            second = _matmul_at(items, range(i + 1, min(i + 4, len(items))))
            if first is None or second is None:
                continue
            if any(p.name.startswith(_SOFTMAX) for p in items[max(first - 2, 0):first]):
                continue  # softmax, matmul, softmax, matmul ...: weighted sums, not attention
            out.append(Op(items[first].ts, items[second].end, "attention", o.tid, o.parents))
    return out
