"""Which line holds tensors alive: the container append or attribute store that keeps them.

A memory site's allocation line says where a kept tensor was made (``loss = criterion(...)``);
the line to change is the one that keeps it (``losses.append(loss)``). At the time a memory
capture is judged, the live tensors on the kept storages are found on the heap, their referrers
(a list, dict or set, or an object's attribute) and those containers' owners (a function's local,
a module's global, an object's attribute) named, and the store into them looked up in the owner's
source: ``name.append(``, ``name[...] =``, ``name +=``, ``self.attr =``, ... Two passes over the
heap, once per memory capture: never in a training step's hot path.
"""

from __future__ import annotations

import dis
import gc
import inspect
import linecache
import re
import sys
import types
import warnings
from collections.abc import Iterable
from typing import Any

import torch

from profcallbacks.detect.frames import CallerFrames, display_path

_CONTAINERS = (list, dict, set, tuple)
_ITEM = r"\s*(\[[^\]]*\]|\.(setdefault|get)\(.*?\))"
"""How a container held inside another is reached before the store: ``[key]``, ``.setdefault(...)``."""
_STORES = (r"\.\s*(append|extend|insert|add|update|appendleft|setdefault|put)\s*\(",
           r"\s*\[[^\]]*\]\s*=[^=]", r"\s*\+=", r"\s*=[^=]")


def holders(pointers: set[int], frames: CallerFrames) -> dict[int, tuple[str, str, bool]]:
    """``{storage pointer: (line, what holds it, held with an autograd graph)}`` for the storages
    in ``pointers`` whose live tensors sit in a container or attribute stored on a user's line."""
    with warnings.catch_warnings():  # objects on the heap may warn when looked at
        warnings.simplefilter("ignore")
        return _holders(pointers, frames)


def _holders(pointers: set[int], frames: CallerFrames) -> dict[int, tuple[str, str, bool]]:
    tensors = [t for t in _heap_tensors() if _pointer(t) in pointers]
    if not tensors:
        return {}
    own = {id(tensors)}
    this = sys._getframe()
    found: dict[int, tuple[str, str, bool]] = {}
    by_id = {id(t): t for t in tensors}
    containers: list[Any] = []
    held: dict[int, list[torch.Tensor]] = {}
    for ref in gc.get_referrers(*tensors):
        if id(ref) in own or ref is this or isinstance(ref, types.FrameType):
            continue
        inside = _members(ref, by_id)
        if inside:
            containers.append(ref)
            held[id(ref)] = inside
    owners = gc.get_referrers(*containers) if containers else []
    dicts = [o for o in owners if isinstance(o, dict) and "__file__" not in o]
    for obj in gc.get_referrers(*dicts) if dicts else []:  # objects whose __dict__ holds one
        if _attributes(obj) is not None and any(_attributes(obj) is d for d in dicts):
            owners.append(obj)
    running = []  # running frames are no referrers the collector sees: their locals
    stack = this.f_back  # are looked at on this thread's stack (the training loop's)
    while stack is not None:
        running.append(stack)
        stack = stack.f_back
    owners += running
    ours = {id(containers), id(owners), id(dicts), id(running)}
    for container in containers:
        where = _store_line(container, owners, frames, this) or _nested_store_line(
            container, [o for o in owners if id(o) not in ours], running, frames, this)
        if where is None:
            continue
        graph = any(t.grad_fn is not None for t in held[id(container)])
        for tensor in held[id(container)]:
            found.setdefault(_pointer(tensor), (*where, graph))
    del tensors, by_id, containers, held, owners
    return found


def _nested_store_line(container: Any, owners: list[Any], running: list[types.FrameType],
                       frames: CallerFrames, this: types.FrameType) -> tuple[str, str] | None:
    """The store into ``container`` through the dict or list that holds it (one level:
    ``history["loss"].append(loss)``, ``metrics.setdefault(k, []).append(...)``)."""
    for parent in owners:
        if not isinstance(parent, (list, dict)) or not any(
                v is container for v in (parent.values() if isinstance(parent, dict) else parent)):
            continue
        where = _store_line(parent, gc.get_referrers(parent) + running, frames, this,
                            through=_ITEM)
        if where is not None:
            line, held_by = where
            return line, f"a {type(container).__name__} in {held_by}"
    return None


def _attributes(obj: Any) -> dict[str, Any] | None:
    """``obj.__dict__`` of an instance (not of a class or module), else ``None``."""
    if isinstance(obj, (type, types.ModuleType, dict)):
        return None
    try:
        found = object.__getattribute__(obj, "__dict__")
    except Exception:
        return None
    return found if isinstance(found, dict) else None


def _heap_tensors() -> Iterable[torch.Tensor]:
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor):
            yield obj


def _pointer(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except Exception:
        return -1


def _members(ref: Any, by_id: dict[int, torch.Tensor]) -> list[torch.Tensor]:
    """The tensors of ``by_id`` that ``ref`` (a container or an object) holds directly."""
    if isinstance(ref, dict):
        values: Iterable[Any] = ref.values()
    elif isinstance(ref, _CONTAINERS):
        values = ref
    elif _attributes(ref) is not None:
        values = (_attributes(ref) or {}).values()
    else:
        return []
    return [by_id[id(v)] for v in values if id(v) in by_id]


def _store_line(container: Any, owners: list[Any], frames: CallerFrames,
                this: types.FrameType, through: str = "") -> tuple[str, str] | None:
    """``(path:line, "losses (a list)")`` of the user's store into ``container`` (or, with
    ``through``, into what ``container[...]`` holds)."""
    kind = type(container).__name__
    instance = next((o for o in owners if isinstance(container, dict)
                     and _attributes(o) is container), None)  # an object's own attribute dict
    if instance is not None or not isinstance(container, _CONTAINERS):
        container = container if instance is None else instance
        for name, value in (_attributes(container) or {}).items():
            if isinstance(value, torch.Tensor):
                line = _class_line(type(container), rf"self\.{re.escape(name)}", frames, direct=True)
                if line:
                    return line, f"{type(container).__name__}.{name}"
        return None
    for owner in owners:
        if owner is this or owner is container:
            continue
        if isinstance(owner, types.FrameType) and frames.is_user(owner.f_code.co_filename):
            for name, value in owner.f_locals.items():
                if value is container:
                    line = _code_line(owner.f_code, re.escape(name) + through)
                    if line:
                        return line, f"{name} (a {kind} in {owner.f_code.co_name}())"
        elif isinstance(owner, dict) and isinstance(owner.get("__file__"), str) \
                and frames.is_user(owner["__file__"]):
            for name, value in owner.items():
                if value is container:
                    line = _file_line(owner["__file__"], re.escape(name) + through)
                    if line:
                        return line, f"{name} (a {kind} of {owner.get('__name__', 'a module')})"
        elif _attributes(owner) is not None:
            for name, value in (_attributes(owner) or {}).items():
                if value is container:
                    line = _class_line(type(owner), rf"self\.{re.escape(name)}{through}",
                                       frames)
                    if line:
                        return line, f"{type(owner).__name__}.{name} (a {kind})"
    return None


def _matches(text: str, name: str, direct: bool) -> bool:
    stores = _STORES if direct else _STORES[:3]
    return any(re.search(rf"(?<![\w.]){name}{store}", text) for store in stores)


def _code_line(code: types.CodeType, name: str) -> str | None:
    for _, line in sorted({(n, n) for _, n in dis.findlinestarts(code) if n}):
        if _matches(linecache.getline(code.co_filename, line), name, direct=False):
            return f"{display_path(code.co_filename)}:{line}"
    return None


def _file_line(path: str, name: str) -> str | None:
    for number, text in enumerate(linecache.getlines(path), 1):
        if _matches(text, name, direct=False):
            return f"{display_path(path)}:{number}"
    return None


def _class_line(cls: type, name: str, frames: CallerFrames, direct: bool = False) -> str | None:
    try:
        path = inspect.getsourcefile(cls)
        lines, first = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return None
    if path is None or not frames.is_user(path):
        return None
    for offset, text in enumerate(lines):
        if _matches(text, name, direct):
            return f"{display_path(path)}:{first + offset}"
    return None
