"""``allocator_churn``: device memory allocated and freed through the driver inside steady steps.

PyTorch's caching allocator keeps freed blocks and serves later allocations from them, so a
steady training loop makes no ``cudaMalloc``/``cudaFree`` (``hipMalloc``/``hipFree``) calls after
its first steps. Many such calls in the steps mean the cache is off
(``PYTORCH_NO_CUDA_MEMORY_CACHING=1``, ``PYTORCH_NO_HIP_MEMORY_CACHING=1``) or thrashing (shapes
that change every step fragment it, memory near full makes it release and retry). ``cudaFree``
and ``hipFree`` also wait for the device, so each leaves the GPU idle while the host refills it.

Trigger: at least ``MIN_CALLS`` allocation/free calls in the steps (``MIN_PER_STEP`` per step where
steps are marked), outside the cold part.

Gain (``whatif.idle_caused``): the GPU idle those calls cause (the host waiting in them while the
GPU still runs loses nothing), at most the calls' own time: with the cache serving the
allocations they would not happen.

Negative case: allocations in the first step only (the cache growing: ``cold_start``'s), or a
handful per step (a new shape now and then).

Seen on AMD-AGI/TraceLens's ResNet-18 MI300X trace without the pool: ~290 ``hipMalloc`` and ~270
``hipFree`` per iteration, ``hipFree`` 3.35 s of a 3.39 s span.
"""

from __future__ import annotations

from profcallbacks.report.analyse.diagnoses.model import Capture, Diagnosis, ms
from profcallbacks.report.analyse.diagnoses.whatif import idle_caused
from profcallbacks.report.model.intervals import merge

ALLOC_CALLS = ("cudaMalloc", "cudaFree", "hipMalloc", "hipFree", "cudaMallocAsync",
               "cudaFreeAsync", "hipMallocAsync", "hipFreeAsync")
"""Driver allocation calls (not ``cudaHostAlloc``/``hipHostMalloc``: pinned host memory)."""
MIN_CALLS = 50
MIN_PER_STEP = 10


def allocator_calls(cap: Capture) -> int:
    """How many device allocation and free calls the capture's steps make (cold part left out)."""
    return sum(1 for c in cap.runtime if c.name in ALLOC_CALLS and cap.in_steps(c.ts))


def allocator_churn(cap: Capture) -> Diagnosis | None:
    """See the module docstring."""
    calls = [c for c in cap.runtime if c.name in ALLOC_CALLS and cap.in_steps(c.ts)]
    if len(calls) < MIN_CALLS or (not cap.whole_span and len(calls) / cap.n_steps < MIN_PER_STEP):
        return None
    spans = merge((c.ts, c.end) for c in calls)
    own = sum(e - s for s, e in spans)
    cost = min(idle_caused(cap, spans), own) if cap.has_gpu else own
    gain, share = cap.per_step(cost)
    by_name: dict[str, list[float]] = {}
    for c in calls:
        acc = by_name.setdefault(c.name, [0, 0.0])
        acc[0] += 1
        acc[1] += c.end - c.ts
    per = "in the traced span" if cap.whole_span else "per step"
    n = 1 if cap.whole_span else cap.n_steps
    rocm = any(c.name.startswith("hip") for c in calls)
    basis = (f"~{gain:.2f} ms: the GPU idle the {len(calls) // n} allocation calls {per} cause "
             f"({ms(own / n)} in them); served from the cache they would not happen")
    env = "PYTORCH_HIP_ALLOC_CONF" if rocm else "PYTORCH_CUDA_ALLOC_CONF"
    off = "PYTORCH_NO_HIP_MEMORY_CACHING" if rocm else "PYTORCH_NO_CUDA_MEMORY_CACHING"
    return Diagnosis(
        kind="allocator_churn",
        what="device memory is allocated and freed through the driver inside the steps",
        evidence=["allocation calls: " + ", ".join(
            f"{name} x{int(c) // n} {ms(t / n)}" for name, (c, t) in
            sorted(by_name.items(), key=lambda kv: -kv[1][1])) + f" {per}", basis],
        where=None, gain_ms=gain, gain_share=share,
        fix=[f"Keep PyTorch's caching allocator on (unset {off}) and set "
             f"{env}=expandable_segments:True so freed blocks are reused, not returned.",
             "Keep tensor shapes fixed between steps (pad variable lengths to a few buckets) so "
             "the cache is not fragmented."],
        details={"basis": basis, "calls": len(calls)})
