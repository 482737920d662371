"""Whose code a Python frame runs: the user's, a library's (by package), or plumbing.

One classification for everything that names a user's line: the sync audit (the line that made
the host wait, with its call chain), memory sites (the line that keeps memory) and the compile
watcher (the line that called a compiled function, and whether a graph break is in torch's own
code). User code is everything outside the named libraries, the site-packages directories and
Python's standard library; plumbing (the standard library, torch's thin public wrappers, the
caller's own module) is looked through.

Example:
    >>> import json
    >>> frames = CallerFrames(("json",))
    >>> frames.kind(json.__file__), frames.kind(os.__file__), frames.kind("/work/train.py")
    ('json', '', None)
"""

from __future__ import annotations

import importlib.util
import os
import sysconfig
from collections.abc import Iterable
from types import FrameType

TORCH_WRAPPERS = ("_tensor.py", "functional.py", "overrides.py", "_ops.py", "_jit_internal.py",
                  "_compile.py", os.path.join("_dynamo", "eval_frame.py"),
                  os.path.join("nn", "functional.py"), os.path.join("utils", "_python_dispatch.py"))
"""torch's thin public wrappers: what runs inside them belongs to the user line that called them."""
CHAIN_FRAMES = 4
"""Most user frames in a call chain (the innermost ones)."""


class CallerFrames:
    """Classifies source files as user code, a library (by package) or plumbing to look through.

    Args:
        libraries: Packages whose files are library code, named by the package.
        plumbing: Files looked through as well (the spy's own module).
    """

    def __init__(self, libraries: Iterable[str], plumbing: Iterable[str] = ()) -> None:
        self._roots: list[tuple[str, str]] = []
        for name in libraries:
            spec = importlib.util.find_spec(name)
            for root in (spec.submodule_search_locations or []) if spec else []:
                self._roots.append((os.path.normcase(root) + os.sep, name))
        self._torch = next((r for r, n in self._roots if n == "torch"), "\0")
        paths = sysconfig.get_paths()
        self._site = {os.path.normcase(paths[k]) + os.sep for k in ("purelib", "platlib")}
        self._stdlib = os.path.normcase(paths["stdlib"]) + os.sep
        self._plumbing = {os.path.normcase(path) for path in plumbing}
        self._cache: dict[str, str | None] = {}

    def kind(self, filename: str) -> str | None:
        """``None`` for user code, ``""`` for plumbing to look through, else a library name."""
        if filename in self._cache:
            return self._cache[filename]
        path = os.path.normcase(filename)
        kind: str | None = None
        if filename.startswith("<frozen") or path in self._plumbing:
            kind = ""
        elif path.startswith(self._torch) and path[len(self._torch):] in TORCH_WRAPPERS:
            kind = ""
        else:
            kind = next((n for r, n in self._roots if path.startswith(r)), None)
            site = next((s for s in self._site if path.startswith(s)), None)
            if kind is None and site is not None:
                kind = path[len(site):].split(os.sep, 1)[0]
            elif kind is None and path.startswith(self._stdlib):
                kind = ""
        self._cache[filename] = kind
        return kind

    def is_user(self, filename: str) -> bool:
        """``filename`` is the user's code (no library, no plumbing)."""
        return self.kind(filename) is None

    def torch_code(self, filename: str | None) -> bool:
        """``filename`` is torch's own code or Python's standard library (not the user's, not
        another library's): e.g. the wrapper of a compiled DistributedDataParallel."""
        return bool(filename) and self.kind(filename or "") in ("", "torch")

    def user_frame(self, frame: FrameType | None) -> FrameType | None:
        """The innermost user frame from ``frame`` out (``None``: only library code)."""
        while frame is not None and self.kind(frame.f_code.co_filename) is not None:
            frame = frame.f_back
        return frame

    def user_line(self, frame: FrameType | None) -> str:
        """``path:line`` of the innermost user frame from ``frame`` out, else ``"<library>"``."""
        user = self.user_frame(frame)
        return "<library>" if user is None else location(user)

    def call_chain(self, frame: FrameType | None, most: int = CHAIN_FRAMES) -> list[str]:
        """``file:line function`` of the user's frames from ``frame`` out, outermost first,
        until a library called them (or ``most`` of them)."""
        chain: list[str] = []
        while frame is not None and len(chain) < most:
            code = frame.f_code
            kind = self.kind(code.co_filename)
            if kind is None:
                where = location(frame)
                if chain and chain[-1].startswith(where + " "):  # a generator on the same line
                    chain.pop()
                chain.append(f"{where} {getattr(code, 'co_qualname', code.co_name)}")
            elif kind:
                break
            frame = frame.f_back
        return chain[::-1]


def display_path(filename: str) -> str:
    """``filename`` relative to the working directory when inside it, else absolute."""
    path = os.path.abspath(filename)
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def location(frame: FrameType) -> str:
    """``path:line`` of ``frame`` (the path as :func:`display_path` shows it)."""
    return f"{display_path(frame.f_code.co_filename)}:{frame.f_lineno}"
