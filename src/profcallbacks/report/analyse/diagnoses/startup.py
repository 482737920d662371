"""``cold_start``: the capture holds one-off start-up work, so it is not a steady-state picture.

Trigger (either):

- CUDA runtime calls of ``COLD_CALL_US`` or more that do not wait for the GPU (not a
  synchronize, not a memcpy): ordinary launches, allocations and stream calls take
  microseconds; tens of milliseconds are lazy CUDA initialisation (the first call of a process:
  ``cudaDeviceGetStreamPriorityRange``, ``cudaFree(0)``, ``cudaGetDeviceProperties``), module
  loading at a kernel's first launch, the caching allocator growing (``cudaMalloc``/``cudaFree``)
  or cuDNN/cuBLAS autotuning behind a first convolution or matmul;
- with three or more steps, the first at least ``FIRST_STEP_RATIO`` times the median of the
  others (compilation, autotuning, first allocation growth);
- cuDNN autotuning (``torch.backends.cudnn.benchmark=True``): ``cudaEventSynchronize`` calls
  inside a cuDNN convolution operator (``aten::cudnn_convolution*``) time the candidate
  algorithms at a shape's first call. The whole operator is one-off work, and its syncs are not
  per-step syncs for ``sync_in_step`` (a 2021 ResNet-50 trace: 357 such calls, 424 ms, in its
  first iteration).

Cost: the union of those calls (or the first step's excess over the median, whichever is larger)
spread over the captured steps. That time is left out of the steady-state step of every later
rule, and the steady state is given in ``details``.

Not judged on a CUPTI range-profiling trace (``cuda_profiler_range`` events): each kernel was
replayed to read its counters, so every launch took tens of milliseconds of the profiler's time.

Allocation calls are left to ``allocator_churn`` when the steps make many of them (a cache that is
off or thrashing, not one growing).

Negative case: a capture scheduled past start-up (no such call; steps of even length).
"""

from __future__ import annotations

import bisect
import statistics

from profcallbacks.core.trace_names import GRAPH_CAPTURE_CALLS, KERNEL, LAUNCH_CALL_PART
from profcallbacks.report.analyse.diagnoses.allocator import ALLOC_CALLS, MIN_CALLS, allocator_calls
from profcallbacks.report.analyse.diagnoses.model import Capture, Diagnosis, Op, ms, op_path
from profcallbacks.report.model.intervals import merge

COLD_CALL_US = 20_000.0
FIRST_STEP_RATIO = 2.0
_WAITS = ("Synchronize", "Memcpy", "StreamWaitEvent", "EventQuery", "GraphLaunch")
_INIT_HINTS = {"cudaDeviceGetStreamPriorityRange": "lazy CUDA initialisation",
               "cudaGetDeviceProperties": "lazy CUDA initialisation",
               "cudaFree": "CUDA context set-up or allocator release",
               "cudaMalloc": "caching allocator growth (first allocations)",
               "cudaHostAlloc": "pinned-memory pool growth",
               "cudaLaunchKernel": "module loading at first launch",
               "cudaStreamCreateWithFlags": "stream creation (library handles: cuDNN/cuBLAS)"}


def cold_start(cap: Capture) -> Diagnosis | None:
    """See the module docstring."""
    if cap.replayed:
        return None
    churn = allocator_calls(cap) >= MIN_CALLS  # allocations every step are not start-up
    long_calls = [c for c in cap.runtime if c.end - c.ts >= COLD_CALL_US
                  and not any(w in c.name for w in _WAITS)
                  and not (churn and c.name in ALLOC_CALLS)]
    tuning = autotune_ops(cap)
    cold = merge([*((c.ts, c.end) for c in long_calls), *((o.ts, o.end) for o in tuning)])
    calls_us = sum(e - s for s, e in cold)
    first_us = 0.0
    if len(cap.steps) >= 3:
        durs = [e - s for s, e, _ in cap.steps]
        rest = statistics.median(durs[1:])
        if rest > 0 and durs[0] >= FIRST_STEP_RATIO * rest:
            first_us = durs[0] - rest
    if calls_us <= 0 and first_us <= 0:
        return None
    evidence: list[str] = []
    where = None
    if calls_us >= first_us:
        cap.cold = cold
        by_name: dict[str, list[float]] = {}
        for c in long_calls:
            acc = by_name.setdefault(c.name, [0, 0.0])
            acc[0] += 1
            acc[1] += c.end - c.ts
        top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:4]
        if top:
            evidence.append("one-off CUDA calls: " + ", ".join(
                f"{n} x{int(c)} {ms(t)}" + (f" ({_INIT_HINTS[n]})" if n in _INIT_HINTS else "")
                for n, (c, t) in top))
        if tuning:
            syncs = [c for c in cap.runtime if c.name == AUTOTUNE_SYNC
                     and any(o.ts <= c.ts <= o.end for o in tuning)]
            evidence.append(
                f"cuDNN autotuning (torch.backends.cudnn.benchmark=True): {len(tuning)} "
                f"convolution call(s) {ms(sum(o.end - o.ts for o in tuning))} timing candidate "
                f"algorithms with {AUTOTUNE_SYNC} x{len(syncs)} "
                f"{ms(sum(c.end - c.ts for c in syncs))}: once per input shape, not per step")
        longest = max([*long_calls, *tuning], key=lambda c: c.end - c.ts)
        where = op_path(longest.parents) if longest.parents else longest.name
        cold_us = calls_us
    else:
        s, e, number = cap.steps[0]
        cap.cold = [(s, s + first_us)]
        evidence.append(f"first step {number}: {ms(e - s)} against a median of "
                        f"{ms(e - s - first_us)} for the other {len(cap.steps) - 1}")
        where = f"step {number}"
        cold_us = first_us
    span_us = cap.span_ms() * 1e3
    steady_ms = cap.step_ms()
    evidence.append(f"the capture spans {ms(span_us)}; {ms(cold_us)} of it "
                    f"({cold_us / span_us:.0%}) is start-up" if span_us > 0 else "")
    gain, _ = cap.per_step(cold_us)
    share = cold_us / span_us if span_us > 0 else 0.0
    steady = _steady(cap)
    if steady:
        evidence.append(steady)
    return Diagnosis(
        kind="cold_start",
        what="the capture is not steady state: it includes one-off start-up work",
        evidence=[e for e in evidence if e], where=where, gain_ms=gain, gain_share=share,
        fix=["Schedule the capture past start-up: profcallbacks Schedule(skip_first=N) or "
             "torch.profiler.schedule(skip_first=N, wait=1, warmup=1, active=3) with N past "
             "the first steps (" + ("lazy CUDA init, cuDNN autotune with cudnn.benchmark, "
                                    if not cap.cpu_only else "")
             + "torch.compile, allocator growth all happen there).",
             "Run a few warm-up iterations before a benchmark's measured ones; numbers of this "
             "capture's steady part are given without the cold part."],
        details={"cold_ms": cold_us / 1e3, "steady_step_ms": steady_ms})


CAPTURED_SHARE = 0.1
"""A trace that runs fewer kernels than this share of its launches recorded a graph capture."""
MIN_LAUNCHES = 50


def graph_capture(cap: Capture) -> dict[str, int] | None:
    """``{"launches", "executed"}`` when ``cap`` records a CUDA/HIP graph capture: graph-capture
    calls, and at least ``MIN_LAUNCHES`` kernel launches of which under ``CAPTURED_SHARE`` ran
    (the launches went into a graph; a vLLM capture trace: 428 launches, 7 kernels); else None."""
    if not cap.kernels or not any(c.name in GRAPH_CAPTURE_CALLS for c in cap.runtime):
        return None  # without any GPU event the GPU was not recorded: nothing says captured
    launches = sum(1 for c in cap.runtime if LAUNCH_CALL_PART in c.name)
    executed = sum(1 for k in cap.kernels if k.cat == KERNEL)
    if launches < MIN_LAUNCHES or executed >= CAPTURED_SHARE * launches:
        return None
    return {"launches": launches, "executed": executed}


AUTOTUNE_SYNC = "cudaEventSynchronize"
"""The call cuDNN's benchmark mode times candidate algorithms with."""


def autotune_ops(cap: Capture) -> list[Op]:
    """The cuDNN convolution operators that ran autotuning: ``AUTOTUNE_SYNC`` calls inside them."""
    convs = sorted(cap.ops.named(lambda n: "cudnn_convolution" in n), key=lambda o: o.ts)
    if not convs:
        return []
    starts = [o.ts for o in convs]
    found: dict[int, Op] = {}
    for c in cap.runtime:
        if c.name != AUTOTUNE_SYNC:
            continue
        i = bisect.bisect_right(starts, c.ts) - 1
        while i >= 0 and convs[i].ts > c.ts - 60e6:  # the innermost enclosing one (within 60 s)
            if convs[i].end >= c.end and convs[i].tid == c.tid:
                found[id(convs[i])] = convs[i]
                break
            i -= 1
    return sorted(found.values(), key=lambda o: o.ts)


def _steady(cap: Capture) -> str:
    """The GPU's busy share of the steady part (the cold part left out)."""
    if not cap.has_gpu:
        return ""
    start, end = cap.steps[0][0], cap.steps[-1][1]
    cold = merge(cap.cold)
    busy = merge((k.ts, k.end) for k in cap.kernels if k.end > start and k.ts < end
                 and not any(s <= k.ts <= e for s, e in cold))
    span = (end - start) - sum(min(e, end) - max(s, start) for s, e in cold if e > start and s < end)
    if span <= 0:
        return ""
    busy_us = sum(e - s for s, e in busy)
    return (f"steady part (cold part left out): {ms(span)}, GPU busy {busy_us / span:.0%} "
            f"of it")
