"""The trace vocabulary: names torch.profiler gives events, defined once for writers and readers.

Every category of every trace generation the report reads, and the names of the ranges that mark
steps, batch fetches, optimizer steps, collectives and blocking calls. Any module that looks for one
of these names imports it from here; ``tests/test_layout.py`` fails when one is written elsewhere.

Example:
    >>> from profcallbacks.core.trace_names import STEP_PREFIX, normal_category
    >>> normal_category("Kernel"), "ProfilerStep#7".startswith(STEP_PREFIX)
    ('kernel', True)
"""

# Categories of torch 2.x traces (Kineto's chrome trace).
CPU_OP = "cpu_op"
USER_ANNOTATION = "user_annotation"
PYTHON_FUNCTION = "python_function"
CPU_INSTANT_EVENT = "cpu_instant_event"
CUDA_RUNTIME = "cuda_runtime"
CUDA_DRIVER = "cuda_driver"
KERNEL = "kernel"
GPU_MEMCPY = "gpu_memcpy"
GPU_MEMSET = "gpu_memset"
GPU_USER_ANNOTATION = "gpu_user_annotation"
TRACE_SPAN = "Trace"
"""The profiler's own event spanning the whole trace."""
FWDBWD_FLOW = "fwdbwd"
"""Flow events joining a forward op to its backward."""
FINDINGS_TRACK = "profcallbacks_finding"
"""The findings track profcallbacks adds to its exported traces: readers leave it out."""
LOADER_WORKER_TRACK = "profcallbacks_loader_worker"
"""The loader workers' tracks profcallbacks adds to its exported traces: readers leave them out."""

OLD_CATEGORIES = {"Operator": CPU_OP, "Runtime": CUDA_RUNTIME, "Kernel": KERNEL,
                  "Memcpy": GPU_MEMCPY, "Memset": GPU_MEMSET, "Python": PYTHON_FUNCTION}
"""torch 1.8-1.13 category -> the torch 2.x name the report reads."""

HOST_CATEGORIES = frozenset({CPU_OP, USER_ANNOTATION, PYTHON_FUNCTION})
"""Categories of host-side ranges, where step and loader markers may appear."""
RUNTIME_CATEGORIES = frozenset({CUDA_RUNTIME, CUDA_DRIVER})
"""Host-side calls into the GPU runtime (launches, copies, synchronisations)."""
GPU_CATEGORIES = frozenset({KERNEL, GPU_MEMCPY, GPU_MEMSET})
"""Work on a GPU stream."""
DEVICE_CATEGORIES = GPU_CATEGORIES | RUNTIME_CATEGORIES | {GPU_USER_ANNOTATION}
"""Events only a trace with accelerator activity holds."""
HOST_ONLY_CATEGORIES = frozenset({CPU_OP, USER_ANNOTATION, PYTHON_FUNCTION, CPU_INSTANT_EVENT,
                                  TRACE_SPAN, FWDBWD_FLOW, "Operator", "Python",
                                  "python_function_call", FINDINGS_TRACK,
                                  LOADER_WORKER_TRACK})
"""Categories a trace without any accelerator activity holds (anything else is a device's)."""

# Names of ranges and calls.
STEP_PREFIX = "ProfilerStep#"
"""``ProfilerStep#N``: one training step, recorded by ``prof.step()`` (or by the trace writer)."""
DATALOADER_PREFIXES = ("enumerate(DataLoader)#", "enumerate(DataPipe)#")
"""Event names of a batch fetched from a DataLoader (or a DataPipe): the step's data wait."""
LIGHTNING_LOADER_NAMES = ("[_TrainingEpochLoop].train_dataloader_next",
                          "[TrainingEpochLoop].train_dataloader_next")
"""The range Lightning's own profiler records around ``next(data_fetcher)``."""
LOADER_PREFIXES = (*DATALOADER_PREFIXES, *LIGHTNING_LOADER_NAMES)
"""Names of ranges that wait for the next batch: torch's DataLoader/DataPipe ``__next__`` and the
range Lightning's own profiler records around ``next(data_fetcher)``."""
LIGHTNING_PREFIXES = ("[_TrainingEpochLoop]", "[LightningModule]", "[Strategy]", "[Callback]")
"""Ranges Lightning's own profiler records: the trace comes from a Lightning run."""
OPTIMIZER_PREFIX = "Optimizer.step#"
"""``Optimizer.step#SGD.step``: the range torch records around each optimizer step."""
COMM_PREFIXES = ("nccl:", "c10d::", "gloo:", "record_param_comms")
"""Host-side collective ranges: torch.distributed's ops (``c10d::allreduce_`` ...), the backends'
own ranges on their worker threads (``gloo:all_reduce``, ``nccl:all_reduce``) and the wrapper
torch records around each collective (``record_param_comms``)."""
NCCL_KERNEL_PREFIX = "nccl"
"""GPU kernels of NCCL collectives (``ncclKernel_AllReduce_...``, ``ncclDevKernel_...``)."""
GLOO_PREFIX = "gloo:"
"""Collectives of the gloo backend (CPU)."""
MARKED_PREFIXES = (STEP_PREFIX, *LOADER_PREFIXES, OPTIMIZER_PREFIX, *COMM_PREFIXES)
"""Ranges the report reads by name; a reader keeping only some events keeps these."""
SYNC_CALLS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                        "cudaMemcpy", "cudaMemcpy2D", "cudaMemcpyPeer", "aten::_local_scalar_dense",
                        "aten::item"})
"""Host calls that block until the GPU (or a copy) is done."""
DEVICE_SYNCS = frozenset({"Event Sync", "Context Sync"})
"""GPU-side events of a synchronisation (they are not work)."""
COPY_NAME_PREFIX = "Memcpy"
"""GPU copies' names (``Memcpy HtoD (Pageable -> Device)``)."""


def normal_category(category: str) -> str:
    """The torch 2.x name of ``category`` (an older generation's name mapped, others unchanged)."""
    return OLD_CATEGORIES.get(category, category)
ASYNC_COPY_CALL = "cudaMemcpyAsync"
"""The runtime call of an asynchronous copy (blocking when its host memory is pageable)."""
CUDA_PROFILER_RANGE = "cuda_profiler_range"
"""The category of a replayed capture's range (CUDA graph replays profiled by range)."""
COMPILED_PREFIXES = ("Torch-Compiled Region", "CompiledFunction", "## Call CompiledFxGraph",
                     "TorchDynamo Cache Lookup")
"""Names of the trace ranges torch.compile's code runs in (forward, backward, inductor's graph)."""
BLOCKING_COPY_CALLS = ("cudaMemcpy", "cudaMemcpy2D", "hipMemcpy", "hipMemcpy2D", "hipMemcpyWithStream")
"""Runtime copy calls that return only when the copy is done, whatever its direction (CUDA, HIP)."""
ASYNC_COPY_CALLS = (ASYNC_COPY_CALL, "hipMemcpyAsync")
"""Runtime copy calls that block only when the copy goes to pageable host memory (CUDA, HIP)."""
