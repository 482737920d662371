"""What bounds a capture: one verdict with its share of the step, the evidence and advice.

Each kind has a *share*: the part of the step (or of the GPU timeline) it explains. Kinds that
are waste (input, sync, copy, communication, host) win over the compute kinds as soon as they
pass their threshold, the largest share first: removing waste is what an expert tries first,
and a run that is compute-bound *and* waits 30% of its step for data is input-bound in practice.
Otherwise the compute kind is given when it passes its threshold, else ``balanced``.

Thresholds and why:

- ``WASTE_SHARE`` = 0.15 for ``input_bound`` (data wait / step), ``sync_bound`` (host blocked in
  syncs / step), ``copy_bound`` (host-device memcpy / GPU span) and ``communication_bound``
  (collective time not overlapped with compute / GPU span): a fix then gives back at least ~15%
  throughput, well above the 5-10% that steps of one run wander by on shared machines.
- ``HOST_IDLE_SHARE`` = 0.30 for ``host_bound``: the GPU idles for that share of its span, minus
  the part the host spent blocked in syncs (then the GPU is not waiting for the host). Ordinary
  GPU training idles 5-20% between steps and around optimizer/logging calls; above 30% the
  launch side is the bottleneck and CUDA graphs / larger batches pay more than faster kernels.
- ``COMPUTE_SHARE`` = 0.50 for ``gpu_compute_bound`` (compute kernels / GPU span) and
  ``cpu_compute_bound`` (CPU operators / step, CPU-only traces): most of the time goes into the
  model's own operators.
- ``balanced``: nothing passes; the verdict says so with the numbers.
"""

from __future__ import annotations

from typing import Any

SHARE_OF = {"input_bound": "step", "sync_bound": "step", "cpu_compute_bound": "step",
            "balanced": "step", "copy_bound": "GPU time", "communication_bound": "GPU time",
            "host_bound": "GPU time", "gpu_compute_bound": "GPU time"}
"""What a verdict's ``share`` is a share of."""
WASTE_SHARE = 0.15
HOST_IDLE_SHARE = 0.30
COMPUTE_SHARE = 0.50
KINDS = ("input_bound", "host_bound", "sync_bound", "copy_bound", "communication_bound",
         "gpu_compute_bound", "cpu_compute_bound", "balanced")

ADVICE = {
    "input_bound": ["Raise DataLoader num_workers and prefetch_factor; set pin_memory=True and "
                    "persistent_workers=True.",
                    "Move slow decoding/augmentation out of __getitem__ (pre-process once, or "
                    "on the GPU)."],
    "host_bound": ["Capture the step with CUDA graphs or torch.compile(mode=\"reduce-overhead\") "
                   "to remove per-kernel launch cost.",
                   "Use larger batches and fewer tiny ops (fused optimizers: foreach/fused=True; "
                   "avoid Python loops over tensors)."],
    "sync_bound": ["Keep values on the device: log .item()/.cpu()/.tolist() every N steps, "
                   "replace nonzero/boolean-mask indexing with torch.where.",
                   "Remove explicit torch.cuda.synchronize() calls from the step."],
    "copy_bound": ["Copy from pinned memory with non_blocking=True (DataLoader pin_memory=True).",
                   "Move each tensor to the device once and keep it there; avoid repeated "
                   "host-device round trips."],
    "communication_bound": ["Overlap communication with compute: DDP bucket_cap_mb, "
                            "gradient accumulation with no_sync(), FSDP prefetching.",
                            "Reduce what is sent: bf16 gradients / compression hooks, fewer "
                            "parameters per step."],
    "gpu_compute_bound": ["Use mixed precision (torch.autocast bf16/fp16) and TF32 matmuls.",
                          "Fuse kernels (torch.compile) and look at the top kernels below first."],
    "cpu_compute_bound": ["The CPU operators dominate: use a GPU, or raise torch.set_num_threads, "
                          "torch.compile, or a smaller model; the top operators are listed."],
    "balanced": ["No single bottleneck: compare a later capture against this one to see what "
                 "changes."],
}


def _pct(x: float) -> str:
    return f"{x:.0%}"


def decide(m: dict[str, Any], sync_sites: list[str] | None = None) -> dict[str, Any] | None:
    """The verdict of one capture's metrics (see ``metrics`` in report/analysis.py).

    Args:
        m: ``step_ms``, ``data_wait_ms``, ``cpu_ops_ms``, ``sync_ms`` (per step, ms), ``gpu`` (the
            GPU breakdown or ``None``), ``top_cpu_ops``, ``top_kernels``, ``top_syncs``.
        sync_sites: ``file:line`` of the run's own sync findings, for sync evidence.

    Returns:
        ``{"kind", "share", "evidence", "advice"}``, or ``None`` without a measurable step.

    Example:
        >>> v = decide({"step_ms": 10.0, "data_wait_ms": 6.0, "cpu_ops_ms": 3.0, "gpu": None})
        >>> v["kind"], v["share"], v["evidence"][0]
        ('input_bound', 0.6, 'data wait 6.00 ms of a step 10.00 ms (60%)')
    """
    step = m.get("step_ms") or 0.0
    if step <= 0:
        return None
    gpu = m.get("gpu")
    data = m.get("data_wait_ms", 0.0) / step
    sync = m.get("sync_ms", 0.0) / step if gpu else 0.0
    step_line = f"step {step:.2f} ms"
    waste: dict[str, tuple[float, list[str]]] = {}
    if data >= WASTE_SHARE:
        waste["input_bound"] = (data, [f"data wait {m['data_wait_ms']:.2f} ms of a {step_line} "
                                       f"({_pct(data)})"])
    if gpu:
        copy = sum(v["ms"] for k, v in gpu["memcpy"].items() if "DtoD" not in k) / gpu["span_ms"]
        idle = gpu["idle_share"]
        gpu_line = (f"GPU idle {_pct(idle)}, compute {_pct(gpu['compute_share'])}, non-compute "
                    f"{_pct(gpu['non_compute_share'])} of its {gpu['span_ms']:.1f} ms span")
        if sync >= WASTE_SHARE:
            ev = [f"host blocked in syncs {m['sync_ms']:.2f} ms of a {step_line} ({_pct(sync)})",
                  "top sync calls: " + _items(m.get("top_syncs", []), "ms")]
            if sync_sites:
                ev.append("in your code: " + ", ".join(sync_sites[:3]))
            waste["sync_bound"] = (sync, ev + [gpu_line])
        if copy >= WASTE_SHARE:
            copies = [{"name": k, "ms": v["ms"]} for k, v in gpu["memcpy"].items() if "DtoD" not in k]
            waste["copy_bound"] = (copy, [f"host-device copies {_pct(copy)} of the GPU span",
                                          "copies: " + _items(copies, "ms"), gpu_line])
        exposed = gpu.get("comm_exposed_share") or 0.0
        if exposed >= WASTE_SHARE:
            overlap = gpu.get("comm_overlap_share") or 0.0
            waste["communication_bound"] = (exposed, [
                f"communication not overlapped with compute {_pct(exposed)} of the GPU span "
                f"({_pct(overlap)} of communication overlaps compute)", gpu_line])
        host = idle - sync
        if host >= HOST_IDLE_SHARE:
            ev = [gpu_line]
            if gpu.get("idle_host_wait_share") is not None:
                ev.append(f"of the idle gaps between kernels: host wait "
                          f"{_pct(gpu['idle_host_wait_share'])}, kernel wait "
                          f"{_pct(gpu['idle_kernel_wait_share'])}")
            if gpu.get("short_kernel_share") is not None:
                ev.append(f"{gpu['kernels']} kernels, {_pct(gpu['short_kernel_share'])} shorter "
                          "than 10 us")
            ev.append("top CPU operators: " + _items(m.get("top_cpu_ops", []), "self_ms"))
            waste["host_bound"] = (host, ev)
    if waste:
        kind = max(waste, key=lambda k: waste[k][0])
        share, evidence = waste[kind]
        if kind == "input_bound":
            evidence = evidence + ["top CPU operators: " + _items(m.get("top_cpu_ops", []), "self_ms")]
    elif gpu and gpu["compute_share"] >= COMPUTE_SHARE:
        kind, share = "gpu_compute_bound", gpu["compute_share"]
        evidence = [f"GPU computing {_pct(share)} of its {gpu['span_ms']:.1f} ms span (idle "
                    f"{_pct(gpu['idle_share'])})",
                    "top kernels (whole capture): " + _items(gpu.get("top_kernels", []), "ms")]
    elif not gpu and m.get("cpu_ops_ms", 0.0) / step >= COMPUTE_SHARE:
        kind, share = "cpu_compute_bound", m["cpu_ops_ms"] / step
        evidence = [f"CPU operators {m['cpu_ops_ms']:.2f} ms of a {step_line} ({_pct(share)}); "
                    f"data wait {_pct(data)}",
                    "top CPU operators: " + _items(m.get("top_cpu_ops", []), "self_ms")]
    else:
        kind = "balanced"
        share = max(data, sync, gpu["compute_share"] if gpu else m.get("cpu_ops_ms", 0.0) / step)
        evidence = [f"{step_line}: data wait {_pct(data)}, CPU operators "
                    f"{_pct(m.get('cpu_ops_ms', 0.0) / step)}"
                    + (f", host syncs {_pct(sync)}" if gpu else "")]
        if gpu:
            evidence.append(f"GPU idle {_pct(gpu['idle_share'])}, compute "
                            f"{_pct(gpu['compute_share'])}")
    return {"kind": kind, "share": round(share, 4), "evidence": evidence,
            "advice": list(ADVICE[kind])}


def _items(rows: list[dict[str, Any]], key: str, limit: int = 3) -> str:
    if not rows:
        return "-"
    return ", ".join(f"{_short(r['name'])} {r[key]:.2f} ms" for r in rows[:limit])


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."
