"""What can be seen of a training data loader, as plain data, and advice that fits it."""

from __future__ import annotations

from typing import Any

from profcallbacks.core.cpus import MAX_WORKERS, loader_workers, usable_cpus

LoaderInfo = dict[str, Any]
# attributes through which known wrappers reach the function that really builds the batch: the
# HF Trainer's RemoveColumnsCollator (data_collator), functools.partial (func), decorators
_WRAPPED = ("data_collator", "collate_fn", "func", "__wrapped__")
DEFAULT_COLLATES = ("default_collate", "default_convert", "default_data_collator",
                    "DefaultDataCollator")


def collate_name(collate: object) -> tuple[str, list[str]]:
    """The name of the function that really builds batches, and the wrappers around it.

    Example:
        >>> import functools
        >>> from torch.utils.data import default_collate
        >>> collate_name(functools.partial(default_collate))
        ('default_collate', ['partial'])
    """
    wrappers: list[str] = []
    obj = collate
    for _ in range(6):
        inner = next((w for w in (getattr(obj, a, None) for a in _WRAPPED)
                      if callable(w) and w is not obj), None)
        if inner is None:
            break
        wrappers.append(_name(obj))
        obj = inner
    return _name(obj), wrappers


def _name(obj: object) -> str:
    name = getattr(obj, "__name__", None)
    return name if isinstance(name, str) else type(obj).__name__


def describe_loader(obj: object) -> LoaderInfo:
    """The settings of ``obj`` that matter for input stalls, read from public attributes only.

    Understands ``torch.utils.data.DataLoader`` (and subclasses such as accelerate's
    ``DataLoaderShard``) and Lightning's ``CombinedLoader`` (its first DataLoader); anything else
    is described by its type name.

    Args:
        obj: The loader the front end iterates over.

    Returns:
        ``{"type", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor",
        "batch_size", "collate_fn", "dataset", "sampler", "epoch_ends", "cpus", "cuda"}``; keys
        the loader lacks are absent. ``epoch_ends`` is ``False`` for a loader without a length
        (an ``IterableDataset`` or a sampler that never ends an epoch).
        ``collate_fn`` names the function inside known wrappers (``collate_wrappers``: their
        names, outermost first), e.g. ``default_data_collator`` inside the HF Trainer's
        ``RemoveColumnsCollator``.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> describe_loader(DataLoader(range(10), batch_size=2))["num_workers"]
        0
    """
    from torch.utils.data import DataLoader

    loader = obj
    flattened = getattr(obj, "flattened", None)  # lightning CombinedLoader
    if not isinstance(obj, DataLoader) and isinstance(flattened, list):
        loader = next((x for x in flattened if isinstance(x, DataLoader)), obj)
    info: LoaderInfo = {"type": type(loader).__name__, "cpus": usable_cpus()}
    if isinstance(loader, DataLoader):
        collate, wrappers = collate_name(getattr(loader, "collate_fn", None))
        if wrappers:
            info["collate_wrappers"] = wrappers
        info.update(num_workers=int(loader.num_workers), pin_memory=bool(loader.pin_memory),
                    persistent_workers=bool(loader.persistent_workers),
                    prefetch_factor=loader.prefetch_factor, batch_size=loader.batch_size,
                    collate_fn=collate,
                    dataset=type(loader.dataset).__name__,
                    sampler=type(getattr(loader, "sampler", None)).__name__,
                    epoch_ends=_has_length(loader))
    try:
        import torch

        info["cuda"] = bool(torch.cuda.is_available())
    except Exception:  # a broken CUDA install must not stop training
        info["cuda"] = False
    return info


def _has_length(loader: object) -> bool:
    try:
        len(loader)  # type: ignore[arg-type]
    except Exception:  # TypeError for an IterableDataset or an endless sampler, anything from user code
        return False
    return True


class LoaderPasses:
    """Counts the passes over a loader: a loader set again after steps since the last time
    begins a new pass (``info["passes"]``).

    Example:
        >>> passes = LoaderPasses(); info = {"num_workers": 2, "persistent_workers": False}
        >>> passes.begin(dict(info), 0), passes.begin(dict(info), 0), passes.begin(dict(info), 50)
        (False, False, True)
    """

    def __init__(self) -> None:
        self.passes = 0
        self._step: int | None = None  # the step in progress when the loader was last set

    def begin(self, info: LoaderInfo, step: int) -> bool:
        """The loader of ``info`` is set at ``step``: whether a further pass starts its workers
        again (its first step waits for their start-up)."""
        new_pass = self._step is None or step > self._step
        self.passes += new_pass
        self._step = step
        info["passes"] = self.passes
        return (new_pass and self.passes > 1 and bool(info.get("num_workers"))
                and not info.get("persistent_workers"))


def restarts_workers(info: LoaderInfo) -> bool:
    """Each pass over the loader starts its worker processes again (``num_workers > 0``,
    ``persistent_workers=False``, an epoch that ends): its first batch waits for them.

    Example:
        >>> restarts_workers({"num_workers": 2, "persistent_workers": False})
        True
    """
    return (bool(info.get("num_workers")) and not info.get("persistent_workers")
            and info.get("epoch_ends") is not False)


def stall_advice(info: LoaderInfo, *, bursty: bool, startup: bool = False) -> list[str]:
    """Concrete changes to try for a loader that cannot keep up, most likely first.

    Args:
        info: From :func:`describe_loader` (may be empty when the loader is unknown), with
            ``passes``: the passes over it so far (the session counts them).
        bursty: Waits come in bursts (a few long waits, many steps with none).
        startup: The wait follows the start of training or a pause (first batch, worker start-up).
    """
    advice: list[str] = []
    workers = info.get("num_workers")
    cpus = info.get("cpus", 1)
    passes = int(info.get("passes") or 1)
    if startup:
        if restarts_workers(info):
            advice.append("set persistent_workers=True so workers survive between epochs")
        elif workers == 0:
            advice.append("the first batch is built on the training thread; a slow dataset "
                          "__init__ or first __getitem__ shows here")
        return advice
    if workers == 0:
        advice.append(f"batches are built on the training thread (num_workers=0): try "
                      f"num_workers={loader_workers(cpus)} (one per core this process may use: "
                      f"{cpus})")
    elif workers is not None:
        if workers < loader_workers(cpus):
            advice.append(f"num_workers={workers} workers cannot keep up: raise num_workers "
                          f"to {loader_workers(cpus)} (one per core this process may use: {cpus})")
        elif workers >= cpus:
            advice.append(f"num_workers={workers} already uses every core this process may use "
                          f"({cpus}): make each batch cheaper rather than adding workers")
        else:  # at the rule's cap, with cores to spare
            advice.append(f"num_workers={workers} is already the most the one worker-count rule "
                          f"gives (one per core, at most {MAX_WORKERS}): make each batch cheaper "
                          "rather than adding workers, each of which holds a copy of the dataset")
        if passes > 1 and restarts_workers(info):
            advice.append(f"set persistent_workers=True: the workers were started again for "
                          f"each of the {passes} passes over the loader so far, and each pass's "
                          "first batches wait for them")
        if bursty:
            advice.append(f"waits come in bursts: a larger prefetch_factor (now "
                          f"{info.get('prefetch_factor')}) smooths them")
    if info.get("collate_fn") not in (None, "NoneType", *DEFAULT_COLLATES):
        inside = info.get("collate_wrappers")
        advice.append(f"profile the custom collate_fn ({info['collate_fn']}"
                      + (f", called through {' > '.join(inside)}" if inside else "")
                      + "): it runs per batch")
    advice.append("make __getitem__ cheaper (decode, resize or tokenize once and cache; avoid "
                  "per-sample Python loops)")
    if info.get("cuda") and info.get("pin_memory") is False:
        advice.append("pin_memory=True makes host-to-device copies asynchronous")
    if not info.get("type") or "num_workers" not in info:
        advice.insert(0, "the loader is not a torch DataLoader profcallbacks can read: check "
                         "how many processes build batches")
    return advice
