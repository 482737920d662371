"""Which lines keep memory: allocations of a few steps still alive some steps later, by calling line.

A ``TorchDispatchMode`` sees each new tensor storage with the Python stack of its caller. Lines
are attributed the way the sync audit does (:mod:`~profcallbacks.detect.frames`): the user's
calling line, with allocations made inside libraries (torch, Lightning, transformers) grouped at
the nearest user line. Only weak references are kept, so the spy itself keeps nothing alive.
It costs about as much per op as the sync spy: use it for a few steps, never for a whole run.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Sequence
from types import FrameType, TracebackType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from profcallbacks.detect.frames import CallerFrames
from profcallbacks.detect.memory_holders import holders
from profcallbacks.options.sync_audit import LIBRARIES

MAX_ALLOCATIONS = 200_000  # bounded memory: later allocations of a window are not followed


class MemorySiteSpy(TorchDispatchMode):
    """Remembers each tensor storage allocated on this thread while active, with its calling line.

    Example:
        >>> kept = []
        >>> with MemorySiteSpy() as spy:
        ...     kept.append(torch.zeros(1024))
        ...     scratch = torch.ones(1024) * 2
        >>> del scratch
        >>> [(s["bytes"], s["count"]) for s in spy.alive_sites()]
        [(4096, 1)]
    """

    def __init__(self, libraries: tuple[str, ...] = LIBRARIES) -> None:
        super().__init__()
        self._frames = CallerFrames(libraries)
        self._allocations: list[tuple[weakref.ref[Any], int, str]] = []
        self.dropped = 0

    def __enter__(self) -> MemorySiteSpy:
        super().__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        super().__exit__(exc_type, exc, tb)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        try:
            self._note(out, args, kwargs, sys._getframe(1))
        except Exception:  # a tensor type without storage (sparse, nested): not followed
            pass
        return out

    def _note(self, out: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None,
              frame: FrameType) -> None:
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if not outputs:
            return
        inputs = {_pointer(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        location: str | None = None
        for tensor in outputs:
            storage = tensor.untyped_storage()
            pointer = storage.data_ptr()
            if pointer in inputs or storage.nbytes() == 0:
                continue  # a view, an in-place result or an output seen already
            if len(self._allocations) >= MAX_ALLOCATIONS:
                self.dropped += 1
                continue
            location = location or self._frames.user_line(frame)
            inputs.add(pointer)
            self._allocations.append((weakref.ref(storage), storage.nbytes(), location))

    def alive_sites(self, most: int | None = None) -> list[dict[str, Any]]:
        """``[{"location", "allocated_at", "held_by", "autograd_graph", "bytes", "count"}]`` of
        storages still alive, largest first: ``location`` is the line that holds them (a
        container append or attribute store, :mod:`~profcallbacks.detect.memory_holders`) when
        one is found, else where they were allocated; ``allocated_at`` where they were made."""
        alive = [(storage, nbytes, location) for ref, nbytes, location in self._allocations
                 if (storage := ref()) is not None]
        try:
            held = holders({storage.data_ptr() for storage, _, _ in alive}, self._frames)
        except Exception:  # an odd object on the heap: the allocation lines still tell
            held = {}
        sites: dict[tuple[str, str], dict[str, Any]] = {}
        for storage, nbytes, allocated in alive:
            line, by, graph = held.get(storage.data_ptr(), (allocated, None, False))
            site = sites.setdefault((line, allocated), {
                "location": line, "allocated_at": allocated, "held_by": by,
                "autograd_graph": False, "bytes": 0, "count": 0})
            site["autograd_graph"] = site["autograd_graph"] or graph
            site["bytes"] += nbytes
            site["count"] += 1
        del alive
        ranked = sorted(sites.values(), key=lambda s: (-s["bytes"], s["location"]))
        return ranked[:most] if most is not None else ranked


def _pointer(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except Exception:
        return -1


def describe_sites(sites: Sequence[dict[str, Any]], most: int = 3) -> str:
    """``train.py:24 keeps 1.2 MB in 3 tensors (losses, a list in train(); allocated at
    train.py:21); ...`` for a finding's message."""
    return "; ".join(_describe(s) for s in sites[:most])


def _describe(site: dict[str, Any]) -> str:
    size = site["bytes"] / 2**20
    text = (f"{site['location']} keeps {size:,.1f} MB" if size >= 0.05 else
            f"{site['location']} keeps {site['bytes']:,} bytes") + (
        f" in {site['count']} tensor{'s' if site['count'] != 1 else ''}")
    clues = []
    if site.get("held_by"):
        clues.append(site["held_by"])
    if site.get("allocated_at") and site["allocated_at"] != site["location"]:
        clues.append(f"allocated at {site['allocated_at']}")
    if site.get("autograd_graph"):
        clues.append("with their autograd graphs, not counted: keep .detach() or .item()")
    return text + (f" ({'; '.join(clues)})" if clues else "")
