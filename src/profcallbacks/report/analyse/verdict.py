"""What bounds a capture: one verdict with its share of the step, the evidence and advice.

Each kind has a *share*: the part of the step (or of the GPU timeline) it explains. Kinds that
are waste (input, sync, copy, communication, host) win over the compute kinds when they are a
material share of the step, the largest share first: removing waste is what an expert tries
first, and a run that is compute-bound *and* waits 30% of its step for data is input-bound in
practice. Otherwise the compute kind is given when it passes its threshold, else ``balanced``.

Thresholds and why:

- ``WASTE_SHARE`` = 0.15 for ``input_bound`` (data wait / step), ``sync_bound`` (host blocked in
  syncs / step), ``copy_bound`` (host-device memcpy / GPU span) and ``communication_bound``
  (collective time not overlapped with compute / GPU span; on CPU runs the host-side
  ``c10d::``/``gloo:`` calls and DDP's reducer ranges / step): a fix then gives back at least
  ~15% throughput, well above the 5-10% that steps of one run wander by on shared machines.
- ``HEADLINE_WASTE_SHARE`` = 0.25: when a compute kind passes its own threshold too, a waste
  kind heads the verdict only from this share on. Between 15% and 25% the fix is worth at most
  1.18-1.33x while the compute side holds 50% or more of the step: the compute kind heads and
  the waste is named as ``secondary`` (a 15% data wait beside 80% CPU operators is a CPU-bound
  run that also waits for data, not an input-bound one).
- ``HOST_IDLE_SHARE`` = 0.30 for ``host_bound``: the GPU idles for that share of its span, minus
  the part the host spent blocked in syncs (then the GPU is not waiting for the host).
  On a CPU run ``host_bound`` is the training thread's own code between operators (Python,
  framework overhead: the step less data wait, operators and collectives) from ``COMPUTE_SHARE``
  on: one part over half the step is never ``balanced``.
- ``sync_bound`` with the trace's diagnoses at hand (``diagnoses``): the GPU idle the blocking
  calls cause (``sync_in_step``'s what-if), not the time the host is blocked: a host waiting on a
  95%-busy GPU loses nothing, the work had to finish anyway. The verdict then reads the same
  number as the diagnosis's gain. Ordinary
  GPU training idles 5-20% between steps and around optimizer/logging calls; above 30% the
  launch side is the bottleneck and CUDA graphs / larger batches pay more than faster kernels.
- ``COMPUTE_SHARE`` = 0.50 for ``gpu_compute_bound`` (compute kernels / GPU span) and
  ``cpu_compute_bound`` (CPU operators / step, CPU-only traces): most of the time goes into the
  model's own operators.
- ``balanced``: nothing passes; the verdict says so with the numbers.
- The critical path (``critical_path.py``, ``m["critical_path"]``) says which side a fix must
  shorten: every GPU verdict names it (``shortened_by``, and one evidence line), and a GPU that
  computes most of its own span while the host holds more than ``1/2 + MARGIN`` of the step's
  path (its median step's, so one odd step does not decide) is ``host_bound`` with the host's
  part of that path as its share (``share_of``: ``critical path``): faster kernels would not
  shorten that step (a compiled trace whose one 2 us kernel ran in a 13 s step of compilation).
  Within ``MARGIN`` of half, ``gpu_compute_bound`` is close to ``host_bound`` (kineto's
  ResNet-50 with 4 workers: host and GPU each hold about half of its steady steps' path).
- ``MARGIN`` = 0.03: a share within 3 points of the threshold that decided between the verdict
  and another kind makes the verdict *close*: ``close_to`` names the other kind, and, given the
  kind of the run's previous capture (``previous``), a close call keeps that kind instead of
  flipping (hysteresis). Captures of one steady run wander by a few points; without the margin
  a 15.0% and a 15.3% data wait gave two kinds for one run.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from profcallbacks.report.analyse.advice import RunContext, verdict_advice
from profcallbacks.report.analyse.critical_path import describe

SHARE_OF = {"input_bound": "step", "sync_bound": "step", "cpu_compute_bound": "step",
            "balanced": "step", "copy_bound": "GPU time", "communication_bound": "GPU time",
            "host_bound": "GPU time", "gpu_compute_bound": "GPU time"}
"""What a verdict's ``share`` is a share of."""
WASTE_SHARE = 0.15
HEADLINE_WASTE_SHARE = 0.25
HOST_IDLE_SHARE = 0.30
MARGIN = 0.03
COLD_SHARE = 0.5
"""From this share of the capture in one-off start-up work (``cold_start``) on, the verdict says
it mostly reads start-up and first advises a capture past it."""
COMPUTE_SHARE = 0.50
KINDS = ("input_bound", "host_bound", "sync_bound", "copy_bound", "communication_bound",
         "gpu_compute_bound", "cpu_compute_bound", "balanced")

SECONDARY_KEYS = ("input_bound", "sync_bound", "copy_bound", "communication_bound", "host_bound")


def _pct(x: float) -> str:
    return f"{x:.0%}"


def decide(m: dict[str, Any], sync_sites: list[str] | None = None, *,
           context: RunContext | None = None, previous: str | None = None,
           diagnoses: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """The verdict of one capture's metrics (see ``metrics`` in report/analyse/captures.py).

    Args:
        m: ``step_ms``, ``data_wait_ms``, ``cpu_ops_ms``, ``sync_ms``, ``comm_call_ms`` (per step,
            ms), ``gpu`` (the GPU breakdown or ``None``), ``top_cpu_ops``, ``top_kernels``,
            ``top_syncs``.
        sync_sites: ``file:line`` of the run's own sync findings, for sync evidence.
        context: What the run is, for advice that fits it (report/analyse/advice.py); by default only
            whether it has GPU activity is known.
        previous: The kind of the run's previous capture: a close call keeps it (see ``MARGIN``).
        diagnoses: The capture's diagnoses (report/expert.py): ``sync_bound`` is then the GPU
            idle the syncs cause (``sync_in_step``'s gain), not the host's blocked time.

    Returns:
        ``{"kind", "share", "share_of", "evidence", "advice", "close_to", "held", "secondary"}``
        (``share_of``: ``"step"`` or ``"GPU time"``), or ``None``
        without a measurable step. ``close_to`` is the other kind of a close call (or ``None``),
        ``held`` says the kind was kept from ``previous``, ``secondary`` lists waste kinds that
        passed their threshold without heading the verdict (``[kind, share]``).

    Example:
        >>> v = decide({"step_ms": 10.0, "data_wait_ms": 6.0, "cpu_ops_ms": 3.0, "gpu": None})
        >>> v["kind"], v["share"], v["evidence"][0]
        ('input_bound', 0.6, 'data wait 6.00 ms of a step 10.00 ms (60%)')
    """
    step = m.get("step_ms") or 0.0
    gpu: dict[str, Any] | None = m.get("gpu")
    if gpu is not None and not gpu.get("kernels"):  # annotations or copies, no kernel ran
        gpu = None
        m = dict(m, gpu=None)
    kernels_only = step <= 0 and gpu is not None and (gpu.get("span_ms") or 0.0) > 0
    if kernels_only and gpu is not None:  # GPU events only: the GPU's span is the one step
        step = float(gpu["span_ms"])
        m = dict(m, step_ms=step)
    if step <= 0:
        return None
    waste = _waste(m, step, sync_sites, _gain_of(diagnoses, "sync_in_step"),
                   _gain_of(diagnoses, "input_pipeline"))
    compute = _compute(m, step)
    compute_passes = compute is not None and compute[1] >= COMPUTE_SHARE
    # (kind, share, threshold it had to pass to beat the alternative, the alternative)
    contenders: list[tuple[str, float, float]] = []
    for kind, (share, _, threshold) in waste.items():
        need = max(threshold, HEADLINE_WASTE_SHARE) if compute_passes else threshold
        contenders.append((kind, share, need))
    heading = [c for c in contenders if c[1] >= c[2]]
    if heading:
        kind = max(heading, key=lambda c: c[1])[0]
        share, evidence, _ = waste[kind]
        need = next(c[2] for c in contenders if c[0] == kind)
        alternative = (compute[0] if compute_passes and compute else "balanced")
        runner_up = [c for c in heading if c[0] != kind]
        close_to = alternative if share - need < MARGIN else None
        if runner_up and close_to is None:
            other = max(runner_up, key=lambda c: c[1])
            close_to = other[0] if share - other[1] < MARGIN else None
    elif compute_passes and compute:
        kind, share, evidence = compute
        below = [c for c in contenders if c[2] - c[1] < MARGIN]
        close_to = max(below, key=lambda c: c[1])[0] if below else (
            "balanced" if share - COMPUTE_SHARE < MARGIN else None)
    else:
        kind, share, evidence = _balanced(m, step, gpu)
        below = [c for c in contenders if c[2] - c[1] < MARGIN]
        near_compute = compute is not None and COMPUTE_SHARE - compute[1] < MARGIN
        close_to = (max(below, key=lambda c: c[1])[0] if below
                    else compute[0] if near_compute and compute else None)
    path: dict[str, Any] | None = m.get("critical_path") if gpu else None
    host_path = float(path.get("host_share_median", path["host_share"])) if path else 0.0
    by_path = path is not None and kind == "gpu_compute_bound" and host_path >= 0.5 + MARGIN
    if by_path and path is not None:
        kind, share = "host_bound", host_path
        close_to = "gpu_compute_bound" if host_path - 0.5 < 2 * MARGIN else None
        evidence = [f"the host holds {host_path:.0%} of the median step's critical path "
                    f"({path['host_ms'] + path['launch_ms']:.2f} ms host, {path['data_ms']:.2f} ms "
                    f"data wait, {path['gpu_ms']:.2f} ms GPU per step), although the GPU computes "
                    f"{_pct(gpu['compute_share']) if gpu else '-'} of its own span: faster kernels "
                    f"shorten only the GPU's {1 - host_path:.0%} of it",
                    *(compute[2] if compute else [])]
    elif path is not None and kind == "gpu_compute_bound" and close_to is None \
            and host_path >= 0.5 - MARGIN:  # the host holds about half the path
        close_to = "host_bound"
    held = False
    if close_to is not None and previous == close_to and previous != kind and not by_path:
        alt = _kind_share(previous, waste, compute, m, step, gpu)
        if alt is not None:  # the run's earlier kind is as good a reading: keep it
            close_to, kind = kind, previous
            share, evidence = alt
            held = True
    if kind == "input_bound":
        evidence = evidence + ["top CPU operators: " + _items(m.get("top_cpu_ops", []), "self_ms")]
    secondary = [[k, round(v[0], 4)] for k, v in sorted(waste.items(), key=lambda kv: -kv[1][0])
                 if k != kind and v[0] >= v[2]]
    if secondary:
        evidence = evidence + ["also: " + ", ".join(f"{k} {v:.0%}" for k, v in secondary)]
    ctx = context or RunContext(device="cuda" if gpu else "cpu")
    if gpu and m.get("dtype") and ctx.dtype is None:  # the precision the GEMMs ran in
        ctx = replace(ctx, dtype=m["dtype"])
    crowded = next((d for d in diagnoses or [] if d.get("kind") == "oversubscribed"), None)
    if crowded is not None:  # the machine, before any thread advice
        ctx = replace(ctx, contended=True)
        evidence = [f"the machine is oversubscribed: {crowded['evidence'][1]}; one thread would "
                    f"save {float(crowded['gain_share']):.0%} of the step (oversubscribed)",
                    *evidence]
    advice = verdict_advice(kind, ctx)
    if crowded is not None and kind != "cpu_compute_bound":
        advice = [*crowded.get("fix", [])[:1], *advice]
    if kernels_only:
        evidence = ["the trace holds GPU events only (no CPU operators): the GPU's "
                    f"{step:.1f} ms span is read as one step; host and data wait are unknown",
                    *evidence]
    cold = next((d for d in diagnoses or [] if d.get("kind") == "cold_start"), None)
    if cold is not None and float(cold.get("gain_share", 0.0)) >= COLD_SHARE:
        cold_ms = float((cold.get("details") or {}).get("cold_ms", 0.0))
        evidence = [f"{float(cold['gain_share']):.0%} of the capture ({cold_ms:.0f} ms) is one-off "
                    "start-up work (cold_start): these numbers mostly read start-up, not the "
                    "steady state", *evidence]
        advice = [*cold.get("fix", [])[:1], *advice]
    if ctx.gpu_unrecorded and not gpu:
        evidence = ["no GPU activity was recorded, yet this is a GPU job (CUDA/HIP runtime calls "
                    "or a GPU in deviceProperties): this verdict reads the host only", *evidence]
        advice = ["Record the GPU too: torch.profiler.profile(activities=[ProfilerActivity.CPU, "
                  "ProfilerActivity.CUDA]) (profcallbacks records both by default).", *advice]
    captured = m.get("graph_capture")
    if captured:  # the launches went into a graph: nothing here says how the run runs
        evidence = [f"this trace records a CUDA/HIP graph capture: {captured['launches']} kernel "
                    f"launches recorded into a graph, {captured['executed']} kernels run; it shows "
                    "how the graph was built, not how the step runs", *evidence]
        advice = ["Profile steps that replay the graph (cudaGraphLaunch/hipGraphLaunch), past "
                  "the capture, to judge the run; the step already uses graphs."]
    share_of = "step" if kind in ("communication_bound", "host_bound") and not gpu else SHARE_OF[kind]
    if by_path:
        share_of = "critical path"
    shortened_by = None
    if path is not None:
        shortened_by = path["bound"]
        evidence = [*evidence, describe(path)]
    return {"kind": kind, "share": round(share, 4), "share_of": share_of, "evidence": evidence,
            "advice": advice, "close_to": close_to, "held": held,
            "secondary": secondary, "shortened_by": shortened_by,
            "critical_path": None if path is None else {
                k: (round(v, 4) if isinstance(v, float) else v) for k, v in path.items()}}



def label(verdict: dict[str, Any]) -> str:
    """``input_bound`` or, for a close call, ``input_bound / cpu_compute_bound (close)``."""
    close = verdict.get("close_to")
    return f"{verdict['kind']} / {close} (close)" if close else str(verdict["kind"])


def _gain_of(diagnoses: list[dict[str, Any]] | None, kind: str) -> float | None:
    """The gain (ms per step) of the diagnosis ``kind``: on a GPU trace, for ``sync_in_step`` and
    ``input_pipeline``, the GPU idle the host's waits cause; 0 without one, None without
    diagnoses (the host's own times are used)."""
    if diagnoses is None:
        return None
    found = next((d for d in diagnoses if d.get("kind") == kind), None)
    return float(found["gain_ms"]) if found else 0.0


def _waste(m: dict[str, Any], step: float, sync_sites: list[str] | None,
           sync_idle_ms: float | None = None,
           data_idle_ms: float | None = None) -> dict[str, tuple[float, list[str], float]]:
    """Each waste kind's share, evidence and threshold (``sync_idle_ms``, ``data_idle_ms``: the
    GPU idle per step the syncs and the data wait cause, from the diagnoses)."""
    gpu = m.get("gpu")
    data = m.get("data_wait_ms", 0.0) / step
    step_line = f"step {step:.2f} ms"
    out: dict[str, tuple[float, list[str], float]] = {
        "input_bound": (data, [f"data wait {m.get('data_wait_ms', 0.0):.2f} ms of a {step_line} "
                               f"({_pct(data)})"], WASTE_SHARE)}
    if not gpu:  # CPU run: the host-side collectives, not overlapped by compute (report/analyse/host_side.py)
        exposed_ms = m.get("comm_exposed_ms", 0.0)
        comm = min(exposed_ms / step, 1.0)
        out["communication_bound"] = (comm, [
            f"collectives (c10d/gloo/nccl calls) not overlapped with compute {exposed_ms:.2f} ms "
            f"of a {step_line} ({_pct(comm)}); all collective time {m.get('comm_call_ms', 0.0):.2f} "
            "ms"], WASTE_SHARE)
        between = _between_ops(m, step)
        out["host_bound"] = (between / step, [
            f"framework/Python overhead between operators {between:.2f} ms of a {step_line} "
            f"({_pct(between / step)}): the training thread's own code, not its operators "
            f"({m.get('cpu_ops_ms', 0.0):.2f} ms) nor its data wait", "top CPU operators: "
            + _items(m.get("top_cpu_ops", []), "self_ms")], COMPUTE_SHARE)
        return out
    blocked = m.get("sync_ms", 0.0) / step
    sync = blocked if sync_idle_ms is None else min(sync_idle_ms / step, blocked)
    copy = sum(v["ms"] for k, v in gpu["memcpy"].items() if "DtoD" not in k) / gpu["span_ms"]
    idle = gpu["idle_share"]
    gpu_line = (f"GPU idle {_pct(idle)}, compute {_pct(gpu['compute_share'])}, non-compute "
                f"{_pct(gpu['non_compute_share'])} of its {gpu['span_ms']:.1f} ms span")
    ev = [f"host blocked in syncs {m.get('sync_ms', 0.0):.2f} ms of a {step_line} ({_pct(blocked)})"
          + ("" if sync_idle_ms is None else f"; the GPU idles {step * sync:.2f} ms for them "
             f"({_pct(sync)}), the rest it was still working"),
          "top sync calls: " + _items(m.get("top_syncs", []), "ms")]
    if sync_sites:
        ev.append("in your code: " + ", ".join(sync_sites[:3]))
    out["sync_bound"] = (sync, ev + [gpu_line], WASTE_SHARE)
    copies = [{"name": k, "ms": v["ms"]} for k, v in gpu["memcpy"].items() if "DtoD" not in k]
    out["copy_bound"] = (copy, [f"host-device copies {_pct(copy)} of the GPU span",
                                "copies: " + _items(copies, "ms"), gpu_line], WASTE_SHARE)
    exposed = gpu.get("comm_exposed_share") or 0.0
    overlap = gpu.get("comm_overlap_share") or 0.0
    out["communication_bound"] = (exposed, [
        f"communication not overlapped with compute {_pct(exposed)} of the GPU span "
        f"({_pct(overlap)} of communication overlaps compute)", gpu_line], WASTE_SHARE)
    ev = [gpu_line]
    if gpu.get("idle_host_wait_share") is not None:
        ev.append(f"of the idle gaps between kernels: host wait "
                  f"{_pct(gpu['idle_host_wait_share'])}, kernel wait "
                  f"{_pct(gpu['idle_kernel_wait_share'])}")
    if gpu.get("short_kernel_share") is not None:
        ev.append(f"{gpu['kernels']} kernels, {_pct(gpu['short_kernel_share'])} shorter than 10 us")
    ev.append("top CPU operators: " + _items(m.get("top_cpu_ops", []), "self_ms"))
    # the GPU idle the host's waits cause is theirs, not a slow host's (per step -> span share)
    waited_ms = sync * step + min(data_idle_ms or 0.0, m.get("data_wait_ms", 0.0))
    waited = waited_ms * max(m.get("steps", 1), 1) / gpu["span_ms"] if gpu["span_ms"] else 0.0
    if data_idle_ms:
        ev.append(f"the data wait leaves the GPU idle {data_idle_ms:.2f} ms per step (counted as "
                  "input, not host)")
    out["host_bound"] = (max(idle - waited, 0.0), ev, HOST_IDLE_SHARE)
    return out


def _between_ops(m: dict[str, Any], step: float) -> float:
    """A CPU run's time between operators per step (ms): not data wait, operators or collectives."""
    ops = max(m.get("cpu_ops_ms", 0.0) - m.get("comm_exposed_ms", 0.0), 0.0)
    return max(step - m.get("data_wait_ms", 0.0) - ops - m.get("comm_exposed_ms", 0.0), 0.0)


def _compute(m: dict[str, Any], step: float) -> tuple[str, float, list[str]] | None:
    """The compute kind of the capture with its share and evidence."""
    gpu = m.get("gpu")
    if gpu:
        share = gpu["compute_share"]
        return ("gpu_compute_bound", share, [
            f"GPU computing {_pct(share)} of its {gpu['span_ms']:.1f} ms span (idle "
            f"{_pct(gpu['idle_share'])})",
            "top kernels (whole capture): " + _items(gpu.get("top_kernels", []), "ms")])
    ops = max(m.get("cpu_ops_ms", 0.0) - m.get("comm_exposed_ms", 0.0), 0.0)
    share = ops / step
    data = m.get("data_wait_ms", 0.0) / step
    return ("cpu_compute_bound", share, [
        f"CPU operators {ops:.2f} ms of a step {step:.2f} ms ({_pct(share)}); data wait {_pct(data)}",
        "top CPU operators: " + _items(m.get("top_cpu_ops", []), "self_ms")])


def _balanced(m: dict[str, Any], step: float, gpu: Any) -> tuple[str, float, list[str]]:
    data = m.get("data_wait_ms", 0.0) / step
    sync = m.get("sync_ms", 0.0) / step if gpu else 0.0
    ops = m.get("cpu_ops_ms", 0.0) / step
    between = 0.0 if gpu else _between_ops(m, step) / step
    share = max(data, sync, gpu["compute_share"] if gpu else max(ops, between))
    evidence = [f"step {step:.2f} ms: data wait {_pct(data)}, CPU operators {_pct(ops)}"
                + (f", host syncs {_pct(sync)}" if gpu else
                   f", framework/Python between operators {_pct(between)}")]
    if gpu:
        evidence.append(f"GPU idle {_pct(gpu['idle_share'])}, compute {_pct(gpu['compute_share'])}")
    return "balanced", share, evidence


def _kind_share(kind: str, waste: dict[str, tuple[float, list[str], float]],
                compute: tuple[str, float, list[str]] | None, m: dict[str, Any], step: float,
                gpu: Any) -> tuple[float, list[str]] | None:
    """Share and evidence of ``kind`` for this capture (``None`` when it does not apply)."""
    if kind in waste:
        return waste[kind][0], waste[kind][1]
    if compute is not None and kind == compute[0]:
        return compute[1], compute[2]
    if kind == "balanced":
        _, share, evidence = _balanced(m, step, gpu)
        return share, evidence
    return None


def _items(rows: list[dict[str, Any]], key: str, limit: int = 3) -> str:
    if not rows:
        return "-"
    return ", ".join(f"{_short(r['name'])} {r[key]:.2f} ms" for r in rows[:limit])


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


WAITING_KINDS = ("communication_bound", "sync_bound")
"""Verdicts whose time a late rank can cause: the others wait for it in collectives."""


def with_stragglers(verdict: dict[str, Any] | None,
                    job: dict[str, Any] | None) -> dict[str, Any] | None:
    """``verdict`` naming the straggler ranks of ``job`` (``ranks.job_view``) as the cause when it
    reads waiting in collectives: a rank that arrives early waits there for the last one, so its
    collective time is the late rank's doing, not communication. ``waiting_for`` lists those ranks
    (empty when none); the first evidence line and the first advice name them.

    Example:
        >>> v = {"kind": "communication_bound", "evidence": ["comm 80%"], "advice": ["Overlap."]}
        >>> job = {"stragglers": [{"rank": 3, "host": "n1", "others_wait_ms": 4.0}]}
        >>> with_stragglers(v, job)["waiting_for"], with_stragglers(v, job)["advice"][0][:26]
        ([3], 'Find why rank 3 on n1 arri')
    """
    if verdict is None:
        return None
    slow = (job or {}).get("stragglers") or []
    if not slow or verdict.get("kind") not in WAITING_KINDS:
        return dict(verdict, waiting_for=[])
    ranks = [s["rank"] for s in slow]
    named = ", ".join(f"rank {s['rank']}" + (f" on {s['host']}" if s.get("host") else "")
                      for s in slow[:4]) + (f" and {len(slow) - 4} more" if len(slow) > 4 else "")
    worst = max(float(s["others_wait_ms"]) for s in slow)
    line = (f"the other ranks wait in the collectives for {named}, which arrive last (up to "
            f"{worst:.2f} ms per step): that part of the collective time is the late rank's, not "
            "communication")
    advice = (f"Find why {named} arrive{'s' if len(slow) == 1 else ''} late at the collectives "
              "(compare their data wait, host and GPU time with the other ranks'): speeding up "
              "the communication cannot remove that wait.")
    return dict(verdict, evidence=[line, *verdict.get("evidence", [])],
                advice=[advice, *verdict.get("advice", [])], waiting_for=ranks)
