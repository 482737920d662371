"""``input_pipeline``: the loader's settings behind a data wait.

Trigger: the data loader's ranges (``enumerate(DataLoader)#...__next__``, Lightning's
``[_TrainingEpochLoop].train_dataloader_next``) cover at least
``DATA_SHARE`` of the steady step. The iterator's name tells the worker setting:
``_SingleProcessDataLoaderIter`` is ``num_workers=0`` (batches built on the training thread);
``_MultiProcessingDataLoaderIter`` has workers that cannot keep up. On a GPU trace, host-to-device
copies from pageable memory mean ``pin_memory`` is off. Gain: the data wait that loader workers
would take off the step (``whatif.loader_saving``): with ``num_workers=0`` a batch takes the wait
to build; N workers build N at a time while the rest of the step runs, so what is left is the
part the rest of the step does not hide. N is the fewest workers that hide the whole wait (at
most ``MAX_WORKERS``): the trace does not say how many cores the training process had, so the fix
names N and the limit (one worker per core that process may use, as ``core.cpus.loader_workers``).
With workers already there, the whole wait is the bound. On a GPU the wait counts only where the
GPU idles for it (``whatif.idle_caused``): queued kernels hide a data wait.
Negative case: a loader that keeps ahead (no ``__next__`` range longer than a few us; the V100 trace).
"""

from __future__ import annotations

import math

from profcallbacks.report.analyse.advice import MAX_WORKERS
from profcallbacks.report.analyse.diagnoses.model import Capture, Diagnosis, ms
from profcallbacks.report.analyse.diagnoses.whatif import idle_caused, loader_saving
from profcallbacks.report.model.intervals import merge
from profcallbacks.report.read.generations import LOADER_PREFIXES

DATA_SHARE = 0.05


def input_pipeline(cap: Capture) -> Diagnosis | None:
    """See the module docstring."""
    waits = [o for o in cap.ops.named(lambda n: n.startswith(LOADER_PREFIXES)) if cap.in_steps(o.ts)]
    if not waits:
        return None
    spans = merge((o.ts, o.end) for o in waits)
    cost = sum(e - s for s, e in spans)
    wait, share = cap.per_step(cost)
    if share < DATA_SHARE:
        return None
    single = any("SingleProcess" in o.name for o in waits)
    multi = any("MultiProcessing" in o.name for o in waits)
    rest = max(cap.step_ms() - wait, 0.0)
    workers = max(1, min(MAX_WORKERS, math.ceil(wait / rest) if rest > 0 else MAX_WORKERS))
    if single:
        saved, basis = loader_saving(wait, rest, workers)
    else:
        saved, basis = wait, f"data wait {wait:.2f} ms per step (all of it, at best)"
    if cap.has_gpu:
        hidden = idle_caused(cap, spans) / 1e3 / cap.n_steps
        if hidden < saved:
            basis += f"; the GPU idles {hidden:.2f} ms of it (queued kernels hide the rest)"
        saved = min(saved, hidden)
    gain = saved
    share = gain / cap.step_ms() if cap.step_ms() > 0 else 0.0
    basis = f"~{gain:.2f} ms: {basis}"
    pageable = cap.has_gpu and any(k.cat == "gpu_memcpy" and "Pageable -> Device" in k.name
                                   for k in cap.kernels)
    evidence = [f"data wait {ms(cost / cap.n_steps)} per step", basis]
    fix = []
    if single:
        evidence.append("the iterator is _SingleProcessDataLoaderIter: num_workers=0, every batch "
                        "is built on the training thread")
        fix.append(f"DataLoader(num_workers={workers}, persistent_workers=True): {workers} "
                   "worker(s) build a batch within the rest of the step; no more than one per "
                   "core the training process may use (os.sched_getaffinity).")
    elif multi:
        evidence.append("the iterator is _MultiProcessingDataLoaderIter: the workers do not keep "
                        "up")
        fix.append("Raise num_workers and prefetch_factor, set persistent_workers=True (workers "
                   "restarted each epoch stall its first batches), and make __getitem__/collate "
                   "cheaper (decode once" + (", augment on the GPU)." if cap.has_gpu else ")."))
    if pageable:
        evidence.append("host-to-device copies come from pageable memory: pin_memory is off")
        fix.append("DataLoader(pin_memory=True) and .to('cuda', non_blocking=True).")
    if not fix:
        fix.append("Feed the loop faster: more loader workers, prefetching, cheaper "
                   "__getitem__/collate.")
    return Diagnosis(kind="input_pipeline", what="the training loop waits for the data loader",
                     evidence=evidence, where=waits[0].name, gain_ms=gain, gain_share=share,
                     fix=fix, details={"basis": basis, "data_wait_ms": round(wait, 4),
                                       "workers": workers})
