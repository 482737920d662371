"""``sync_in_step`` and ``launch_bound``: the host waiting on the GPU, or the GPU on the host.

``sync_in_step``. Trigger (GPU traces): the host blocked inside steps in ``cudaStreamSynchronize``,
``cudaDeviceSynchronize``, ``cudaEventSynchronize``, ``cudaMemcpy`` or a ``cudaMemcpyAsync`` whose
copy goes device-to-host (``.item()``, ``.cpu()``, ``.tolist()``, printing a tensor, ``if
tensor:``). The profiler's own flush at the end of its window (a ``cudaDeviceSynchronize`` after
the last step; in a trace without step markers every ``cudaDeviceSynchronize``, as a benchmark
harness's timing syncs look the same) is not counted, nor are host-to-device copies from pageable
memory (``pageable_copy``). Cost: the time covered by those calls. ``where``: the run's own sync
findings' ``file:line``, else the innermost Python frame outside torch around the longest call
(traces recorded ``with_stack=True``), else the operators around it. HIP's names count the same
(``hipStreamSynchronize``, ``hipDeviceSynchronize``, ``hipMemcpy``, ``hipMemcpyWithStream``, which
blocks, and ``hipMemcpyAsync`` to the host). Gain: not the time the host is blocked but the GPU idle
those calls cause (``whatif.idle_caused``): a host waiting on a busy GPU loses nothing, the work had
to finish anyway (the H100 Qwen trace: a 16 ms ``cudaDeviceSynchronize`` with the GPU 95% busy).
Negative case: a trace whose only long sync is the window-end flush (the V100 trace).

``launch_bound``. Trigger (GPU traces, steady part only, the cold part left out): at least
``MIN_KERNELS`` kernels, at least half of them shorter than 10 us, the GPU idle for at least 30% of
the steps, and most idle gaps opened by a launch that came after the previous kernel ended (the
host was late), with the host neither blocked in a sync nor waiting for the data loader meanwhile
(those gaps are ``sync_in_step``'s and ``input_pipeline``'s). A capture whose host is initialising
(long one-off calls, few long kernels: the AlexNet trace) does not qualify. Not judged on a CUPTI
range-profiling trace (``cuda_profiler_range`` events: each kernel was replayed, so launches took
the profiler's time). Cost: the idle time behind late launches. Negative case: long kernels back to
back.
"""

from __future__ import annotations

from profcallbacks.report.analyse.diagnoses.model import Capture, Diagnosis, Op, ms, op_path
from profcallbacks.report.analyse.diagnoses.whatif import busy_of, idle_caused
from profcallbacks.report.model.intervals import merge, subtract
from profcallbacks.report.read.capture_model import enclosing_frame
from profcallbacks.report.read.generations import LOADER_PREFIXES

MIN_KERNELS = 100
SHORT_US = 10.0
IDLE_SHARE = 0.30
_SKIP_FRAMES = ("site-packages", "dist-packages", "/torch/", "<built-in", "lib/python", "threading.py")
BLOCKING_COPIES = ("cudaMemcpy", "cudaMemcpy2D", "hipMemcpy", "hipMemcpy2D", "hipMemcpyWithStream")
"""Copy calls that return only when the copy is done, whatever its direction."""
ASYNC_COPIES = ("cudaMemcpyAsync", "hipMemcpyAsync")
"""Copy calls that block only when the copy goes to (pageable) host memory."""
DEVICE_SYNCS = ("cudaDeviceSynchronize", "hipDeviceSynchronize")


def _blocking(cap: Capture) -> list[Op]:
    copies = {k.launch_ts for k in cap.kernels if k.cat == "gpu_memcpy" and "DtoH" in k.name}
    out = [c for c in cap.runtime if "Synchronize" in c.name or c.name in BLOCKING_COPIES
           or (c.name in ASYNC_COPIES and c.ts in copies)]
    if cap.whole_span:  # no step markers: a harness's or the profiler's syncs cannot be told apart
        out = [c for c in out if c.name not in DEVICE_SYNCS]
    return [c for c in out if cap.in_steps(c.ts)]


def sync_in_step(cap: Capture) -> Diagnosis | None:
    """See the module docstring."""
    if not cap.has_gpu:
        return None
    syncs = _blocking(cap)
    if not syncs:
        return None
    blocked = sum(e - s for s, e in merge((c.ts, c.end) for c in syncs))
    busy = busy_of(cap)
    cost = min(idle_caused(cap, [(c.ts, c.end) for c in syncs], busy), blocked)
    gain, share = cap.per_step(cost)
    blocked_ms = blocked / 1e3 / cap.n_steps
    busy_share = 1 - cost / blocked if blocked > 0 else 0.0
    basis = (f"~{gain:.2f} ms: the GPU idle the {len(syncs) / cap.n_steps:.0f} blocking call(s) "
             f"per step cause; the host waits {blocked_ms:.2f} ms in them, "
             f"{busy_share:.0%} of it while the GPU still had work (not lost)")
    by_name: dict[str, list[float]] = {}
    for c in syncs:
        acc = by_name.setdefault(c.name, [0, 0.0])
        acc[0] += 1
        acc[1] += c.end - c.ts
    longest = max(syncs, key=lambda c: c.end - c.ts)
    where = ", ".join(cap.sync_sites[:3]) or enclosing_frame(cap.frames.get(longest.tid, []),
                                                            longest.ts, _SKIP_FRAMES)
    if where is None:
        where = op_path(longest.parents)
    evidence = ["blocking calls in the steps: " + ", ".join(
        f"{n} x{int(c)} {ms(t)}" for n, (c, t) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:3]),
        "the profiler's own window-end flush is not counted", basis]
    return Diagnosis(kind="sync_in_step", what="the host blocks on the GPU inside the step",
                     evidence=evidence, where=where, gain_ms=gain, gain_share=share,
                     details={"basis": basis, "blocked_ms": round(blocked_ms, 4),
                              "idle_ms": round(gain, 4)},
                     fix=["Keep values on the device inside the step: log .item()/.cpu()/.tolist() "
                          "every N steps, copy device-to-host into pinned memory with "
                          "non_blocking=True, replace nonzero/boolean-mask indexing with "
                          "torch.where; torch.cuda.set_sync_debug_mode('warn') names each line."])


def launch_bound(cap: Capture) -> Diagnosis | None:
    """See the module docstring."""
    if cap.replayed:
        return None
    kernels = [k for k in cap.kernels if k.cat == "kernel" and cap.in_steps(k.launch_ts or k.ts)]
    if len(kernels) < MIN_KERNELS:
        return None
    short_share = sum(1 for k in kernels if k.dur < SHORT_US) / len(kernels)
    if short_share < 0.5:
        return None
    steady = subtract(merge((s, e) for s, e, _ in cap.steps), merge(cap.cold))
    span = sum(e - s for s, e in steady)
    chosen = {id(k) for k in kernels}
    busy = merge((k.ts, k.end) for k in cap.kernels if id(k) in chosen
                 or (k.cat != "kernel" and cap.in_steps(k.launch_ts or k.ts)))
    idle = span - sum(e - s for s, e in busy)
    if span <= 0 or idle / span < IDLE_SHARE:
        return None
    waits = [(c.ts, c.end) for c in _blocking(cap)]
    waits += [(o.ts, o.end) for o in cap.ops.named(lambda n: n.startswith(LOADER_PREFIXES))]
    syncs = merge(waits)
    late = 0.0
    for prev, cur in zip(kernels, kernels[1:], strict=False):
        gap = cur.ts - prev.end
        if gap > 0 and cur.launch_ts is not None and cur.launch_ts > prev.end:
            blocked = sum(max(0.0, min(e, cur.ts) - max(s, prev.end)) for s, e in syncs
                          if s < cur.ts and e > prev.end)
            late += max(gap - blocked, 0.0)
    if late < idle / 2:
        return None
    gain, share = cap.per_step(min(late, idle))
    per_step = len(kernels) / cap.n_steps
    basis = (f"~{gain:.2f} ms: the GPU idle per step behind launches that came after the "
             "previous kernel had ended")
    return Diagnosis(kind="launch_bound",
                     what="the GPU waits on the host launching many short kernels",
                     evidence=[f"{per_step:.0f} kernels per step, {short_share:.0%} shorter than "
                               f"{SHORT_US:.0f} us", f"GPU idle {idle / span:.0%} of the steps; "
                               f"{ms(late)} of it waits for a late launch"],
                     where=None, gain_ms=gain, gain_share=share, details={"basis": basis},
                     fix=["Capture the step with CUDA graphs: torch.compile(model, "
                          "mode='reduce-overhead') or torch.cuda.graphs.",
                          "Fuse small ops (torch.compile), use a fused/foreach optimizer, and "
                          "larger batches so each kernel does more work."])
