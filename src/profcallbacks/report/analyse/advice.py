"""Advice that fits the run: what to try for each verdict and finding kind, chosen from what the run is.

The report knows a run from its traces (device type, GPU name and compute capability), from its
findings (the DataLoader settings the stall detector read: ``num_workers``, ``pin_memory``,
``persistent_workers``, ``prefetch_factor``, the sampler and whether an epoch ever ends) and
from the names in its traces (Lightning's own ranges). :func:`run_context` gathers that into a
:class:`RunContext`; :func:`verdict_advice` and :func:`finding_advice` turn a kind into advice that
can apply: never ``pin_memory`` or "on the GPU" on a CPU run, never ``persistent_workers`` for a
loader whose epoch never ends, mixed-precision advice that matches the GPU's tensor cores.

One problem gets one piece of advice: when the stall detector already chose advice for the run's
own loader (``dataloader_stall`` findings carry it in ``details["advice"]``), the
``input_bound`` verdict gives that same advice, and the report shows it once.

API (stable; other report modules build on it):

- ``run_context(formats, findings, names=(), world_size=1) -> RunContext``
- ``verdict_advice(kind, context) -> list[str]``: one or two sentences, most useful first;
- ``finding_advice(kind, context) -> str | None``: the advice of a finding kind without its own;
- ``without_advice(message) -> str``: a finding's message without its ``Try: ...`` tail.

Example:
    >>> ctx = RunContext(device="cpu")
    >>> any("pin_memory" in line for line in verdict_advice("input_bound", ctx))
    False
    >>> verdict_advice("gpu_compute_bound", RunContext(device="cuda", capability=(7, 0)))[0][:40]
    'Use fp16 mixed precision (torch.autocast'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from profcallbacks.core.cpus import MAX_WORKERS, loader_workers
from profcallbacks.core.trace_names import CUDA_RUNTIME, OLD_CATEGORIES
from profcallbacks.findings import (
    COMPILE_FALLBACK,
    DATALOADER_STALL,
    GRAPH_BREAK,
    MEMORY_CREEP,
    MEMORY_SITES,
    OUT_OF_MEMORY,
    RECOMPILE,
    SLOWDOWN_DIAGNOSIS,
    STEP_SLOWDOWN,
    STRAGGLER,
    SYNC_POINT,
)
from profcallbacks.report.analyse.compile import (
    COMPILE_KINDS,
    COMPILED_PREFIXES,
    FALLBACK_ADVICE,
    GRAPH_BREAK_ADVICE,
    RECOMPILE_ADVICE,
)
from profcallbacks.report.read.generations import LIGHTNING_PREFIXES, TraceFormat

DEVICES = ("cpu", "cuda", "rocm", "unknown")
LOW_PRECISION = ("bf16", "fp16", "fp8", "fp4")
"""GEMM precisions that already use the tensor (matrix) cores at their fastest rates."""
_RUNTIME_NAMES = (CUDA_RUNTIME, *(old for old, new in OLD_CATEGORIES.items() if new == CUDA_RUNTIME))
"""The runtime calls' category in every trace generation: a GPU job's host side."""


@dataclass(frozen=True)
class RunContext:
    """What the run is, as far as its files tell.

    Attributes:
        device: ``"cpu"`` (no device activity in any trace), ``"cuda"``, ``"rocm"`` or ``"unknown"``.
        gpu_name: ``deviceProperties`` name of the first GPU, if any.
        capability: ``(major, minor)`` compute capability of that GPU, if known.
        loader: DataLoader settings read by the stall detector (``describe_loader``), or ``{}``.
        loader_advice: Advice the stall detector chose for that loader, if it found a stall.
        framework: ``"lightning"``, ``"hf"`` or ``None`` (a plain loop, or not known).
        world_size: Processes in the run.
        compiled: The run uses torch.compile (compiled regions in its traces, or compile
            findings): advice does not suggest it again.
        contended: Other work held the machine's cores (a slowdown that grew every operator
            alike): thread advice lowers threads, never raises them.
        gpu_unrecorded: A GPU job whose traces hold no GPU activity (CUDA/HIP runtime calls or a
            GPU in ``deviceProperties``, no kernel): the profiler's activities lacked the GPU.
        dtype: The precision most GEMM kernel time ran in (``fp32``, ``tf32``, ``bf16``,
            ``fp16``, ``fp8`` ...; ``throughput.compute_dtype``), or ``None``: mixed-precision
            advice is for runs not already on it.
    """

    device: str = "unknown"
    gpu_name: str | None = None
    capability: tuple[int, int] | None = None
    loader: Mapping[str, Any] = field(default_factory=dict)
    loader_advice: tuple[str, ...] = ()
    framework: str | None = None
    world_size: int = 1
    compiled: bool = False
    contended: bool = False
    gpu_unrecorded: bool = False
    dtype: str | None = None

    @property
    def gpu(self) -> bool:
        """Whether the run's work ran on a GPU."""
        return self.device in ("cuda", "rocm")

    def public(self) -> dict[str, Any]:
        """The JSON-friendly form written into the report (``run_context``)."""
        keys = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "sampler",
                "epoch_ends")
        return {"device": self.device, "gpu_name": self.gpu_name,
                "capability": list(self.capability) if self.capability else None,
                "loader": {k: self.loader[k] for k in keys if k in self.loader} or None,
                "framework": self.framework, "world_size": self.world_size,
                "compiled": self.compiled, "contended": self.contended}


def run_context(formats: Iterable[TraceFormat], findings: Sequence[Mapping[str, Any]] = (),
                names: Iterable[str] = (), world_size: int = 1) -> RunContext:
    """The :class:`RunContext` of a run.

    Args:
        formats: ``TraceFormat`` of each trace read (report/read/generations.py).
        findings: The run's findings (``kind``, ``details``), as in the report.
        names: Operator and range names seen in the traces (Lightning's ``[...]`` ranges).
        world_size: Processes in the run.
    """
    formats = list(formats)
    names = list(names)
    compiled = (any(f.get("kind") in COMPILE_KINDS for f in findings)
                or any(str(n).startswith(COMPILED_PREFIXES) for n in names))
    device = "unknown"
    gpu_name: str | None = None
    capability: tuple[int, int] | None = None
    if formats:
        with_gpu = [f for f in formats if f.device_events]
        device = "cpu" if not with_gpu else "cuda"
        props = next((f.device for f in with_gpu if f.device), {})
        if props:
            gpu_name = str(props.get("name")) if props.get("name") else None
            major, minor = props.get("computeMajor"), props.get("computeMinor")
            if isinstance(major, int) and isinstance(minor, int):
                capability = (major, minor)
            if props.get("warpSize") == 64 or "AMD" in (gpu_name or ""):
                device = "rocm"
    stall = next((f for f in findings if f.get("kind") == DATALOADER_STALL
                  and isinstance((f.get("details") or {}).get("loader"), dict)), None)
    loader: Mapping[str, Any] = stall["details"]["loader"] if stall else {}
    advice = (stall["details"].get("advice") if stall else None) or []
    framework = next((f.framework for f in formats if f.framework), None)
    if framework is None and (any(n.startswith(LIGHTNING_PREFIXES) for n in names)
                              or loader.get("type") == "CombinedLoader"):
        framework = "lightning"
    elif "RemoveColumnsCollator" in (loader.get("collate_wrappers") or []):
        framework = "hf"
    if device == "unknown" and loader.get("cuda") is False:
        device = "cpu"
    unrecorded = bool(formats) and device == "cpu" and any(
        any(f.categories.get(c) for c in _RUNTIME_NAMES) or f.device for f in formats)
    contended = any(f.get("kind") == SLOWDOWN_DIAGNOSIS and isinstance(f.get("details"), dict)
                    and isinstance(f["details"].get("growth"), dict)
                    and f["details"]["growth"].get("pattern") == "uniform" for f in findings)
    return RunContext(device=device, gpu_name=gpu_name, capability=capability, loader=loader,
                      loader_advice=tuple(str(a) for a in advice if isinstance(a, str)),
                      framework=framework, world_size=world_size, compiled=compiled,
                      contended=contended, gpu_unrecorded=unrecorded)


def verdict_advice(kind: str, context: RunContext | None = None) -> list[str]:
    """What to try for a verdict ``kind`` (report/analyse/verdict.py ``KINDS``), fitted to ``context``."""
    ctx = context or RunContext()
    chooser = _VERDICT.get(kind)
    return chooser(ctx) if chooser else []


def finding_advice(kind: str, context: RunContext | None = None) -> str | None:
    """The advice for findings of ``kind`` that carry none of their own."""
    ctx = context or RunContext()
    if kind == DATALOADER_STALL:
        return _sentence(_input(ctx))
    return _FINDING.get(kind)


def without_advice(message: str) -> str:
    """A finding's message without its trailing ``Try: ...`` (the report shows advice once).

    Example:
        >>> without_advice("waits 40% of the step. Try: raise num_workers.")
        'waits 40% of the step.'
    """
    head, sep, _ = message.partition(". Try: ")
    return head + "." if sep else message


def _sentence(lines: list[str]) -> str:
    return "; ".join(line.rstrip(". ") for line in lines) + "."


def _input(ctx: RunContext) -> list[str]:
    if ctx.loader_advice:
        return [_sentence(list(ctx.loader_advice))]
    loader = ctx.loader
    workers = loader.get("num_workers")
    cpus = loader.get("cpus") if isinstance(loader.get("cpus"), int) else None
    want = loader_workers(cpus) if cpus is not None else MAX_WORKERS
    rule = (f"num_workers={want} (one per core the training process may use, at most "
            f"{MAX_WORKERS})" if cpus is not None else
            f"num_workers to one per core the training process may use (at most {MAX_WORKERS})")
    if workers == 0:
        first = f"Batches are built on the training thread (num_workers=0): set {rule}"
    elif isinstance(workers, int) and cpus is None:
        first = f"Raise DataLoader num_workers (now {workers}) and prefetch_factor"
    elif isinstance(workers, int) and workers < want:
        first = f"Raise DataLoader num_workers from {workers} to {want} and prefetch_factor"
    elif isinstance(workers, int):
        first = (f"num_workers={workers} already uses every core this process may use: make "
                 "each batch cheaper rather than adding workers")
    else:
        first = f"Raise DataLoader {rule} and prefetch_factor"
    if workers and loader.get("persistent_workers") is False and loader.get("epoch_ends") is not False:
        first += "; set persistent_workers=True so workers survive between epochs"
    if ctx.gpu and loader.get("pin_memory") is not True:
        first += "; set pin_memory=True"
    return [first + ".", "Move slow decoding/augmentation out of __getitem__ (pre-process once"
            + (", or on the GPU)." if ctx.gpu else ").")]


def _gpu_compute(ctx: RunContext) -> list[str]:
    major = ctx.capability[0] if ctx.capability and ctx.device == "cuda" else None
    if major is not None and major < 7:
        first = (f"This GPU (compute capability {major}.x) has no tensor cores: fuse kernels "
                 "(torch.compile) and look at the top kernels; mixed precision mainly saves memory")
    elif ctx.dtype in LOW_PRECISION:
        first = (f"The matmuls already run in {ctx.dtype} on the tensor cores: the step gains "
                 "from fewer, larger kernels (bigger batches, fused kernels) rather than from "
                 "precision")
    elif major == 7:
        first = ("Use fp16 mixed precision (torch.autocast(\"cuda\", torch.float16) with a "
                 "GradScaler): on this GPU only fp16 uses the tensor cores (no bf16/TF32)")
    elif ctx.dtype == "tf32":
        first = ("The matmuls run in TF32: bf16 mixed precision (torch.autocast(\"cuda\", "
                 "torch.bfloat16)) doubles their tensor-core rate")
    else:
        first = ("Use mixed precision (torch.autocast bf16/fp16)"
                 + (" and TF32 matmuls" if ctx.device == "cuda" else ""))
    if ctx.compiled:
        return [first + ".", "The step already runs torch.compile'd code: look at the top kernels "
                "below first, then try torch.compile(mode=\"max-autotune\")."]
    return [first + ".", "Fuse kernels (torch.compile) and look at the top kernels below first."]


def _communication(ctx: RunContext) -> list[str]:
    if not ctx.gpu:
        return ["Communicate less often: gradient accumulation with DDP's no_sync(), larger "
                "buckets (bucket_cap_mb) for fewer all-reduces, or fewer ranks per machine when "
                "they share its CPUs.",
                "Reduce what is sent: fp16 gradient compression (DDP comm hook "
                "fp16_compress_hook), fewer parameters per step."]
    return ["Overlap communication with compute: DDP bucket_cap_mb, gradient accumulation with "
            "no_sync(), FSDP prefetching.",
            "Reduce what is sent: bf16 gradients / compression hooks, fewer parameters per step."]


def _cpu_compute(ctx: RunContext) -> list[str]:
    if ctx.contended:
        return ["The machine is oversubscribed: every operator slowed alike while other work "
                "held its cores. Lower torch.set_num_threads to the cores left free (threads x "
                "processes within the cores this process may use), or run on a machine of its "
                "own; more threads only make it slower."]
    threads = ("keep torch.set_num_threads x processes within the cores this process may use "
               "(more threads than free cores slow every operator)")
    if ctx.compiled:
        return ["The CPU operators dominate (the step already runs torch.compile'd code): use a "
                f"smaller model or batch, and {threads}; the top operators are listed."]
    return ["The CPU operators dominate: try torch.compile or a smaller model, and "
            f"{threads}; the top operators are listed."]


def _host(ctx: RunContext) -> list[str]:
    if ctx.device == "cpu":
        return ["The step's time goes to Python and framework code between operators: "
                "torch.compile the model to remove per-operator dispatch, and move logging, "
                "metrics and other per-step Python out of the step or run it every N steps.",
                "Use larger batches and fewer tiny ops (foreach optimizers, no Python loops "
                "over tensors)."]
    return [("Capture the step with CUDA graphs or torch.compile(mode=\"reduce-overhead\") "
             if ctx.device != "rocm" else "Capture the step with HIP graphs (torch.cuda.graphs) "
             "or torch.compile(mode=\"reduce-overhead\") ") + "to remove per-kernel launch cost.",
            "Use larger batches and fewer tiny ops (fused optimizers: foreach/fused=True; avoid "
            "Python loops over tensors)."]


_VERDICT = {
    "input_bound": _input,
    "host_bound": _host,
    "sync_bound": lambda ctx: [
        "Keep values on the device: log .item()/.cpu()/.tolist() every N steps, replace "
        "nonzero/boolean-mask indexing with torch.where.",
        "Remove explicit torch.cuda.synchronize() calls from the step."],
    "copy_bound": lambda ctx: [
        "Copy from pinned memory with non_blocking=True (DataLoader pin_memory=True).",
        "Move each tensor to the device once and keep it there; avoid repeated host-device "
        "round trips."],
    "communication_bound": _communication,
    "gpu_compute_bound": _gpu_compute,
    "cpu_compute_bound": _cpu_compute,
    "balanced": lambda ctx: ["No single bottleneck: compare a later capture against this one to "
                             "see what changes."],
}

_FINDING = {
    SYNC_POINT: "Keep values on the device inside the step: log .item()/.cpu()/.tolist() every N "
                "steps, replace nonzero/boolean-mask indexing with torch.where or masked ops.",
    STEP_SLOWDOWN: "Open the slowdown capture in TensorBoard or Perfetto and compare its top "
                   "operators and data wait with an earlier capture of normal steps.",
    STRAGGLER: "Look at the slow rank's host (other jobs, throttling, slower disk or network) "
               "and at its data shard; every other rank waits for it at each all-reduce.",
    MEMORY_CREEP: "Find what keeps tensors from step to step (the memory_sites finding names the "
                  "lines): lists of losses or outputs (store loss.item() or .detach() every N "
                  "steps), caches keyed by batch, graphs kept through retain_graph.",
    MEMORY_SITES: "Free or detach what these lines keep, or keep it on the host in bounded form.",
    OUT_OF_MEMORY: "Lower the batch size or sequence length, use activation checkpointing or "
                   "mixed precision, and check the memory_creep/memory_sites findings before it.",
    RECOMPILE: RECOMPILE_ADVICE,
    COMPILE_FALLBACK: FALLBACK_ADVICE,
    GRAPH_BREAK: GRAPH_BREAK_ADVICE,
}
