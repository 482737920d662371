"""``input_pipeline``: the loader's settings behind a data wait.

Trigger: the data loader's ranges (``enumerate(DataLoader)#...__next__``, Lightning's
``[_TrainingEpochLoop].train_dataloader_next``) cover at least
``DATA_SHARE`` of the steady step. The iterator's name tells the worker setting:
``_SingleProcessDataLoaderIter`` is ``num_workers=0`` (batches built on the training thread);
``_MultiProcessingDataLoaderIter`` has workers that cannot keep up. On a GPU trace, host-to-device
copies from pageable memory mean ``pin_memory`` is off. Cost: the data wait per step.
Negative case: a loader that keeps ahead (no ``__next__`` range longer than a few us; the V100 trace).
"""

from __future__ import annotations

from profcallbacks.report.analyse.diagnoses.model import Capture, Diagnosis, ms
from profcallbacks.report.model.intervals import merge
from profcallbacks.report.read.generations import LOADER_PREFIXES

DATA_SHARE = 0.05


def input_pipeline(cap: Capture) -> Diagnosis | None:
    """See the module docstring."""
    waits = [o for o in cap.ops if o.name.startswith(LOADER_PREFIXES) and cap.in_steps(o.ts)]
    if not waits:
        return None
    cost = sum(e - s for s, e in merge((o.ts, o.end) for o in waits))
    gain, share = cap.per_step(cost)
    if share < DATA_SHARE:
        return None
    single = any("SingleProcess" in o.name for o in waits)
    multi = any("MultiProcessing" in o.name for o in waits)
    pageable = cap.has_gpu and any(k.cat == "gpu_memcpy" and "Pageable -> Device" in k.name
                                   for k in cap.kernels)
    evidence = [f"data wait {ms(cost / cap.n_steps)} per step ({share:.0%})"]
    fix = []
    if single:
        evidence.append("the iterator is _SingleProcessDataLoaderIter: num_workers=0, every batch "
                        "is built on the training thread")
        fix.append("DataLoader(num_workers=N) with N about the CPU cores per GPU (start at 4), "
                   "persistent_workers=True, prefetch_factor=2 or more.")
    elif multi:
        evidence.append("the iterator is _MultiProcessingDataLoaderIter: the workers do not keep "
                        "up")
        fix.append("Raise num_workers and prefetch_factor, set persistent_workers=True (workers "
                   "restarted each epoch stall its first batches), and make __getitem__/collate "
                   "cheaper (decode once, augment on the GPU).")
    if pageable:
        evidence.append("host-to-device copies come from pageable memory: pin_memory is off")
        fix.append("DataLoader(pin_memory=True) and .to('cuda', non_blocking=True).")
    if not fix:
        fix.append("Feed the loop faster: more loader workers, prefetching, cheaper "
                   "__getitem__/collate.")
    return Diagnosis(kind="input_pipeline", what="the training loop waits for the data loader",
                     evidence=evidence, where=waits[0].name, gain_ms=gain, gain_share=share,
                     fix=fix)
