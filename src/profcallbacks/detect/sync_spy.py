"""A short-lived spy on the operations that make the host wait for the device, with exact lines.

A ``TorchDispatchMode`` sees every aten op with the Python stack of its caller, so the user's
calling line (not the def line a profiler trace gives) is known. It costs about 1.7x on a tiny step:
use it for a few audit steps, never for a whole run or inside a traced step.

What counts. On an accelerator, a candidate op counts when it reads an accelerator tensor. On a
CPU-only run nothing syncs, so the spy reports what *would* sync once the model is on a device:
calls on tensors derived from trainable parameters (``requires_grad`` leaves) or from the
batches the front end hands over (:meth:`SyncSpy.mark`: what ``prof.wrap`` yields, Lightning's
batch), followed op by op inside the dispatch mode (the loss, outputs, metrics computed from
outputs or labels, gradients, optimizer state). Host-side values never are: torch.optim's
``step`` counters (Adam, AdamW, ... unless ``capturable``/``fused``), index tensors built for
data loading, the DataLoader's own tensors (its seed, the collated batch before it is handed
over).
"""

from __future__ import annotations

import linecache
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import FrameType, TracebackType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from profcallbacks.detect.frames import CallerFrames, location
from profcallbacks.options.sync_audit import LIBRARIES

_aten = torch.ops.aten
# inference tensors (``torch.inference_mode``) skip the autograd key where composite ops are
# decomposed: their ``.item()``, ``torch.where(mask)``, ... reach the mode undecomposed
_SCALAR = {_aten._local_scalar_dense.default: "item", _aten.item.default: "item",
           _aten.is_nonzero.default: "bool(tensor)", _aten.equal.default: "torch.equal",
           _aten.allclose.default: "torch.allclose"}
_DATA_DEPENDENT = {_aten.nonzero.default: "nonzero", _aten.nonzero_numpy.default: "nonzero",
                   _aten.where.default: "nonzero", _aten.argwhere.default: "nonzero",
                   _aten.masked_select.default: "masked_select",
                   _aten._unique2.default: "unique", _aten.unique_dim.default: "unique",
                   _aten.unique_consecutive.default: "unique_consecutive",
                   _aten.repeat_interleave.Tensor: "repeat_interleave"}
_MASKED = {_aten.index.Tensor: "boolean mask indexing", _aten.index_put_.default:
           "boolean mask assignment", _aten.index_put.default: "boolean mask assignment"}
_COPIES = {_aten._to_copy.default, _aten.copy_.default}
_METHODS = ("tolist", "numpy", "cpu")
_IMPLICIT_METHODS = ("__format__", "__bool__", "__int__", "__float__", "__index__", "__array__")


@dataclass
class SyncSite:
    """One (location, op) pair seen by the spy.

    Args:
        location: ``"path/to/file.py:LINE"`` of the user's calling line (or ``"<library>"``).
        op: What synchronises: ``"item"``, ``"nonzero"``, ``"boolean mask indexing"``, ...
        library: Package of the innermost non-user frame when the op ran inside a library
            (``"torch"`` for an optimizer's ``item()``), else ``None``.
        calls: How many times it ran.
        blocking_s: Seconds the host spent inside these calls (meaningful on an accelerator).
        on_device: Some call touched an accelerator tensor (a real host-device sync).
        library_sites: ``{library location: calls}`` for library sites.
        library_ops: ``{library location: op}``: what synchronises at each library site.
        chain: The user's frames down to the sync, outermost first (``"main.py:368 train"``,
            at most ``frames.CHAIN_FRAMES``), then the implicit conversion if there is one.
        implicit: The conversion Python called without a visible call (``"Tensor.__format__"``
            for an f-string or ``str.format``, ``"Tensor.__bool__"`` for ``if tensor:``, ...).
    """

    location: str
    op: str
    library: str | None = None
    calls: int = 0
    blocking_s: float = 0.0
    on_device: bool = False
    library_sites: dict[str, int] = field(default_factory=dict)
    library_ops: dict[str, str] = field(default_factory=dict)
    chain: list[str] = field(default_factory=list)
    implicit: str | None = None


class SyncSpy(TorchDispatchMode):
    """Records every host-device sync op run on this thread while active, by calling line.

    Args:
        libraries: Packages whose frames are library code (their syncs go to the nearest user
            frame, marked with the library's name).
        accelerator: Count only ops on accelerator tensors (default: ``torch.cuda.is_available()``);
            without one, count ops on tensors derived from trainable parameters (they would be
            on the accelerator); ``skipped`` counts the calls on host-only tensors left out.
        derived: Tensors an earlier spy found derived from trainable parameters (CPU run).

    Example:
        >>> weight = torch.nn.Parameter(torch.ones(3))
        >>> with SyncSpy(accelerator=False) as spy:
        ...     loss = (weight * 2).sum().item()          # derived from a parameter: counted
        ...     host = torch.ones(3).sum().item()         # a host-only tensor: skipped
        >>> [s.op for s in spy.sites.values()], spy.skipped
        (['item'], 1)
    """

    def __init__(self, libraries: tuple[str, ...] = LIBRARIES, accelerator: bool | None = None,
                 derived: WeakIdKeyDictionary | None = None) -> None:
        super().__init__()
        self.accelerator = torch.cuda.is_available() if accelerator is None else accelerator
        self.sites: dict[tuple[str, str, str | None], SyncSite] = {}
        self.skipped = 0
        # CPU run: tensors derived from trainable parameters (weak keys: nothing is kept alive)
        self._derived: WeakIdKeyDictionary | None = None if self.accelerator else (
            derived if derived is not None else WeakIdKeyDictionary())
        self._frames = CallerFrames(libraries, plumbing=(__file__,))
        self._tid = threading.get_ident()
        self._saved: dict[str, Any] = {}
        self._depth = 0

    def __enter__(self) -> SyncSpy:
        self._tid = threading.get_ident()
        self._patch()
        try:
            super().__enter__()
        except Exception:
            self._unpatch()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            super().__exit__(exc_type, exc, tb)
        finally:
            self._unpatch()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        derived = self._derived
        traced = derived is None or _derives(args, derived) or (
            bool(kwargs) and _derives(tuple(kwargs.values()), derived))
        op = self._sync_op(func, args, kwargs) if self._depth == 0 else None
        if op is not None and not traced and not self._on_behalf(sys._getframe(1)):
            self.skipped += 1  # a host-only tensor: it would not sync on an accelerator either
            op = None
        if op is None:
            out = func(*args, **kwargs)
        else:
            start = time.perf_counter()
            out = func(*args, **kwargs)
            self._record(op, time.perf_counter() - start, sys._getframe(1))
        if derived is not None and traced:
            for item in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(item, torch.Tensor):
                    derived[item] = True
        return out

    def mark(self, batch: Any) -> None:
        """``batch`` (tensors in lists, tuples, dicts) is the step's input: on a CPU run what is
        computed from it counts, as it would be on the accelerator (nothing on an accelerator)."""
        if self._derived is not None:
            for tensor in _tensors(batch):
                self._derived[tensor] = True

    @property
    def derived_tensors(self) -> WeakIdKeyDictionary | None:
        """The tensors known to derive from trainable parameters (CPU run), to hand to the next
        spy; ``None`` on an accelerator."""
        return self._derived

    def derived(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` counts: on a device, or (CPU run) derived from trainable parameters."""
        if self._derived is None:
            return tensor.device.type != "cpu"
        return tensor.requires_grad or tensor in self._derived

    def _on_behalf(self, frame: FrameType | None) -> bool:
        """CPU run: a library call made on the user's line (``self.encoder(src, mask=mask)``)
        was handed a tensor derived from parameters or the batch, so its own values live on
        the same device (a mask added to attention scores must): a sync inside it counts."""
        entry = None
        while frame is not None:
            kind = self._frames.kind(frame.f_code.co_filename)
            if kind is None:
                break
            if kind:
                entry = frame  # the outermost library frame so far
            frame = frame.f_back
        if entry is None or frame is None or self._derived is None:
            return False
        code = entry.f_code
        count = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) + bool(
            code.co_flags & 0x08)  # positional, keyword-only, *args, **kwargs
        values = entry.f_locals
        derived = self._derived
        return any(t.requires_grad or t in derived
                   for name in code.co_varnames[:count] for t in _tensors(values.get(name)))

    def _sync_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        op = _SCALAR.get(func) or _DATA_DEPENDENT.get(func)
        if func is _aten.repeat_interleave.Tensor and kwargs.get("output_size") is not None:
            return None  # its length is given: nothing is read back
        if op is None and func in _MASKED:
            indices = args[1] if len(args) > 1 else ()
            if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                   for i in indices):
                op = _MASKED[func]
        if op is None and self.accelerator and func in _COPIES:
            if func is _aten._to_copy.default:
                src, dst, blocking = args[0], kwargs.get("device"), not kwargs.get("non_blocking")
            else:
                src, dst = args[1], args[0].device
                blocking = not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
            if blocking and dst is not None and torch.device(dst).type == "cpu" and \
                    src.device.type != "cpu":
                return "device-to-host copy"
        if op is None or not self.accelerator:
            return op
        return op if _on_device(args) else None

    def _record(self, op: str, seconds: float, frame: FrameType | None) -> None:
        library, library_at, user_at = None, None, None
        implicit: str | None = None
        while frame is not None:
            kind = self._frames.kind(frame.f_code.co_filename)
            if kind is None:
                user_at = frame
                break
            if kind and library is None:
                library, library_at = kind, frame
            elif not kind and library is None and frame.f_code.co_name in _IMPLICIT_METHODS:
                implicit = f"Tensor.{frame.f_code.co_name}"  # e.g. __format__ in torch/_tensor.py
            frame = frame.f_back
        if user_at is not None and library is None and op == "item":
            op = _scalar_op(user_at)
        if user_at is not None and library is None and implicit is None:
            implicit = _implicit(op, user_at)
        library_op = _scalar_op(library_at) if library_at is not None and op == "item" else op
        location_ = location(user_at) if user_at is not None else "<library>"
        site = self.sites.setdefault((location_, op if library is None else "", library),
                                     SyncSite(location_, op if library is None else "", library))
        if not site.calls and user_at is not None:
            site.chain = self._frames.call_chain(user_at) + ([implicit] if implicit else [])
            site.implicit = implicit
        site.calls += 1
        site.blocking_s += seconds
        site.on_device = site.on_device or self.accelerator
        if library_at is not None:
            where = location(library_at)
            site.library_sites[where] = site.library_sites.get(where, 0) + 1
            site.library_ops[where] = library_op
            if library_op not in site.op.split(", "):
                site.op = f"{site.op}, {library_op}" if site.op else library_op

    def _patch(self) -> None:
        """Wrap methods that read tensor data without dispatching an op (on a CPU tensor)."""
        for name in _METHODS:
            self._saved[name] = torch.Tensor.__dict__.get(name)
            setattr(torch.Tensor, name, self._wrap(name, getattr(torch.Tensor, name)))
        if self.accelerator:
            self._saved["synchronize"] = torch.cuda.synchronize
            torch.cuda.synchronize = self._wrap("torch.cuda.synchronize", torch.cuda.synchronize)

    def _unpatch(self) -> None:
        for name, original in self._saved.items():
            owner: Any = torch.cuda if name == "synchronize" else torch.Tensor
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._saved.clear()

    def _wrap(self, op: str, method: Callable[..., Any]) -> Callable[..., Any]:
        spy = self

        def spied(*args: Any, **kwargs: Any) -> Any:
            tensor = args[0] if args and isinstance(args[0], torch.Tensor) else None
            counts = threading.get_ident() == spy._tid and spy._depth == 0 and (
                tensor is None or spy.derived(tensor))
            if not counts:
                if tensor is not None and spy._depth == 0 and threading.get_ident() == spy._tid:
                    spy.skipped += 1
                return method(*args, **kwargs)
            spy._depth += 1
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spy._depth -= 1
                spy._record(op, time.perf_counter() - start, sys._getframe(1))

        return spied


def _tensors(value: Any, depth: int = 0) -> list[torch.Tensor]:
    """The tensors in ``value``: itself, or inside lists, tuples and mappings (4 levels deep)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if depth >= 4:
        return []
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value[:1000] for t in _tensors(item, depth + 1)]
    return []


def _derives(args: tuple[Any, ...], derived: WeakIdKeyDictionary) -> bool:
    """Some tensor in ``args`` is a trainable parameter or derived from one."""
    for arg in args:
        if isinstance(arg, torch.Tensor):
            if arg.requires_grad or arg in derived:
                return True
        elif isinstance(arg, (list, tuple)):
            for a in arg:
                if isinstance(a, torch.Tensor) and (a.requires_grad or a in derived):
                    return True
    return False


def _on_device(args: tuple[Any, ...]) -> bool:
    for arg in args:
        items = arg if isinstance(arg, (list, tuple)) else (arg,)
        if any(isinstance(a, torch.Tensor) and a.device.type not in ("cpu", "meta") for a in items):
            return True
    return False


def _implicit(op: str, frame: FrameType) -> str | None:
    """The conversion Python called for ``op`` on the user's line, when the line shows none."""
    if op == "bool(tensor)":
        return "Tensor.__bool__"
    if op == "int(tensor)":
        return "Tensor.__int__"
    if op == "float(tensor)":
        return "Tensor.__float__"
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    if op == "item" and ".item(" not in line and ("[" in line or "range(" in line):
        return "Tensor.__index__"  # a tensor used as an index or a count
    return None


def _scalar_op(frame: FrameType) -> str:
    """Name a ``_local_scalar_dense`` by what the calling line says: item(), float(), if ..."""
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    for needle, name in ((".item(", "item"), ("float(", "float(tensor)"), ("int(", "int(tensor)"),
                         ("bool(", "bool(tensor)")):
        if needle in line:
            return name
    return "bool(tensor)" if line.lstrip().startswith(
        ("if ", "while ", "elif ", "assert ", "and ", "or ", "not ")) else "item"
