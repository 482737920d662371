"""Dynamo's words, read: guard failures, graph-break messages, recompile-limit warnings, stacks.

Pure functions over the strings torch writes (``CompilationMetrics.recompile_reason``, the
``graph_breaks`` log lines, the ``hit config.recompile_limit`` warning), so they are tested on
dynamo's real messages without a compile.
"""

from __future__ import annotations

import linecache
import re
from collections.abc import Callable
from typing import NamedTuple

RESUME_PREFIX = "torch_dynamo_resume_in_"
"""Dynamo names the code after a graph break ``torch_dynamo_resume_in_<function>_at_<line>``."""

_GUARD = re.compile(r"tensor '(?P<name>.+?)' (?P<what>[\w ]+?) mismatch(?: at index (?P<index>\d+))?"
                    r"\. expected (?P<old>.+?), actual (?P<new>.+?)\s*$")
_COMPILE_ID = re.compile(r"^\s*\[?\d+/\d+\]?:\s*")
_SOURCE_COMMENT = re.compile(r"\s{2,}#.*$")  # dynamo appends the guarded source line
_SOURCE = re.compile(r"^L\['(?P<name>[^']+)'\]$")
_LIMIT = re.compile(r"hit config\.(?P<limit>\w+) \((?P<value>\d+)\)")
_FUNCTION = re.compile(r"function: '(?P<name>[^']+)' \((?P<file>.+):(?P<line>\d+)\)")
_LAST_REASON = re.compile(r"(?:last reason|reasons?): (?P<reason>.+)")
_BREAK_AT = re.compile(r"in user code at (?P<file>.+?):(?P<line>\d+)")
_TRACEBACK_LINE = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+)', re.MULTILINE)
_STACK_LINE = re.compile(r"Line: (?P<line>\d+), Name: (?P<name>.+?), Filename: (?P<file>.+)$")


class GuardChange(NamedTuple):
    """A failed guard in plain words: ``x.size(1)`` changed from ``128`` to ``131``."""

    what: str
    old: str
    new: str


class LimitHit(NamedTuple):
    """Dynamo's warning that a function reached a recompile limit and now runs eagerly."""

    limit: str  # "recompile_limit", "cache_size_limit", "accumulated_recompile_limit", ...
    value: int | None
    function: str | None
    file: str | None
    line: int | None
    last_reason: str | None


class GraphBreak(NamedTuple):
    """One graph break: where (dynamo's ``file:line``, which may be a library's), why (dynamo's
    first words) and the user code traceback (``(file, line)``, outermost first; empty when dynamo
    suppressed it for a break seen before)."""

    file: str | None
    line: int | None
    reason: str
    hint: str | None
    stack: tuple[tuple[str, int], ...] = ()


def first_reason(recompile_reason: str) -> str:
    """The first failed guard of ``recompile_reason``, without its leading compile id.

    Example:
        >>> first_reason("0/0: tensor 'x' size mismatch at index 1. expected 4, actual 5")
        "tensor 'x' size mismatch at index 1. expected 4, actual 5"
        >>> first_reason("1/0: ___stack2 == 6.1      # print(y.item())  # m.py:31 in f")
        '___stack2 == 6.1'
    """
    line = next((ln for ln in recompile_reason.splitlines() if ln.strip()), "")
    return _SOURCE_COMMENT.sub("", _COMPILE_ID.sub("", line.strip().lstrip("- "))).strip()


def guard_change(reason: str) -> GuardChange | None:
    """Reads a tensor guard failure: which property of which input, old and new value.

    Example:
        >>> guard_change("tensor 'x' size mismatch at index 1. expected 128, actual 131")
        GuardChange(what='x.size(1)', old='128', new='131')
        >>> guard_change("tensor 'L['x']' dtype mismatch. expected Float, actual Half").what
        'x.dtype'
        >>> guard_change("L['self'].training == True") is None
        True
    """
    match = _GUARD.search(first_reason(reason))
    if match is None:
        return None
    name = match["name"]
    source = _SOURCE.match(name)
    if source is not None:
        name = source["name"]
    what, index = match["what"].strip(), match["index"]
    if what == "size" and index is not None:
        label = f"{name}.size({index})"
    elif what == "stride" and index is not None:
        label = f"{name}.stride({index})"
    else:
        label = f"{name}.{what.replace(' ', '_')}"
    return GuardChange(label, match["old"].strip(), match["new"].strip())


def describe_guard(reason: str) -> str:
    """``x.size(1) changed 128 -> 131`` where the guard is a tensor's, else dynamo's words.

    Example:
        >>> describe_guard("0/0: tensor 'x' size mismatch at index 1. expected 128, actual 131")
        'x.size(1) changed 128 -> 131'
    """
    change = guard_change(reason)
    if change is None:
        return first_reason(reason) or "a guard failed"
    return f"{change.what} changed {change.old} -> {change.new}"


def limit_hit(message: str) -> LimitHit | None:
    """Reads dynamo's ``torch._dynamo hit config.<limit> (<n>)`` warning.

    Example:
        >>> hit = limit_hit("torch._dynamo hit config.recompile_limit (8)\\n   function: "
        ...                 "'forward' (/src/model.py:21)\\n   last reason: 0/7: tensor 'x' size "
        ...                 "mismatch at index 1. expected 11, actual 12\\nTo log all ...")
        >>> hit.limit, hit.value, hit.function, hit.line
        ('recompile_limit', 8, 'forward', 21)
    """
    match = _LIMIT.search(message)
    if match is None:
        return None
    function = _FUNCTION.search(message)
    last = _LAST_REASON.search(message)
    return LimitHit(
        limit=match["limit"], value=int(match["value"]),
        function=function["name"] if function else None,
        file=function["file"] if function else None,
        line=int(function["line"]) if function else None,
        last_reason=first_reason(last["reason"]) if last else None)


def graph_break(message: str) -> GraphBreak | None:
    """Reads a ``graph_breaks`` log line (``Graph break in user code at f.py:23 ...``).

    Example:
        >>> gb = graph_break("Graph break in user code at /src/m.py:23\\nGraph Break Reason: "
        ...                  "Encountered graph break when attempting to trace CALL: a function "
        ...                  "call, e.g. f(x, y):\\n\\nUnsupported Tensor.item() call with "
        ...                  "capture_scalar_outputs=False\\n  Explanation: ...\\n  Hint: Set "
        ...                  "`torch._dynamo.config.capture_scalar_outputs = True`\\n")
        >>> gb.file, gb.line, gb.reason
        ('/src/m.py', 23, 'Unsupported Tensor.item() call with capture_scalar_outputs=False')
        >>> graph_break("Graph break in user code at /lib/log.py:61\\nGraph Break Reason: logging"
        ...             "\\nUser code traceback:\\n  File \\"/src/m.py\\", line 7, in forward\\n"
        ...             "    info('hi')\\n  File \\"/lib/log.py\\", line 61, in info\\n").stack
        (('/src/m.py', 7), ('/lib/log.py', 61))
    """
    where = _BREAK_AT.search(message)
    if where is None or "Graph break" not in message:
        return None
    _, _, after = message.partition("Graph Break Reason:")
    lines = [ln.strip() for ln in after.splitlines() if ln.strip()]
    reason = next((ln for ln in lines if not ln.startswith(("Encountered graph break", "Hint:",
                                                            "Explanation:", "User code"))),
                  lines[0] if lines else "unsupported code")
    hint = next((ln[len("Hint:"):].strip() for ln in lines if ln.startswith("Hint:")), None)
    _, _, traceback = after.partition("User code traceback:")
    stack = tuple((m["file"], int(m["line"])) for m in _TRACEBACK_LINE.finditer(traceback))
    return GraphBreak(where["file"], int(where["line"]), reason, hint, stack)


def resumed_function(co_name: str) -> tuple[str, int | None]:
    """The user's function name of dynamo's resume code, and the line of the break before it.

    Example:
        >>> resumed_function("torch_dynamo_resume_in_forward_at_23")
        ('forward', 23)
        >>> resumed_function("forward")
        ('forward', None)
    """
    if not co_name.startswith(RESUME_PREFIX):
        return co_name, None
    name, _, line = co_name[len(RESUME_PREFIX):].rpartition("_at_")
    return (name, int(line)) if name and line.isdigit() else (co_name, None)


def call_site(stack: list[str] | None, is_user: Callable[[str], bool]) -> tuple[str, int] | None:
    """The innermost user frame (``is_user(file)``, :meth:`frames.CallerFrames.is_user`) that
    calls the compiled function.

    ``stack`` is ``CompilationMetrics.stack_trace``: outermost first, the compiled function last.

    Example:
        >>> call_site(["Line: 30, Name: <module>, Filename: /src/train.py",
        ...            "Line: 511, Name: __call__, Filename: /py/torch/_dynamo/eval_frame.py",
        ...            "Line: 21, Name: forward, Filename: /src/model.py"],
        ...           lambda file: not file.startswith("/py/torch"))
        ('/src/train.py', 30)
    """
    if not stack:
        return None
    frames = []
    for entry in stack[:-1]:  # the last frame is the compiled function itself
        match = _STACK_LINE.search(entry)
        if match is not None:
            frames.append((match["file"].strip(), int(match["line"])))
    for file, line in reversed(frames):
        if is_user(file):
            return file, line
    return None


def is_decorator(file: str | None, line: int | None) -> bool:
    """The function defined at ``file:line`` (its first decorator's line, as code objects give
    it) is a decorator's pass-through, made with ``@wraps(...)``/``@functools.wraps(...)``:
    transformers' ``wrapper()``, ``wrapped_func()``."""
    if not file or not line:
        return False
    return any(text.startswith("@") and "wraps(" in text for text in (
        linecache.getline(file, n).strip() for n in (line, line - 1) if n > 0))


def qualified_name(file: str | None, line: int | None, name: str) -> str:
    """``Class.name`` when the ``def`` at ``file:line`` lies in a class body, else ``name``."""
    if not file or not line:
        return name
    text = linecache.getline(file, line)
    indent = len(text) - len(text.lstrip())
    for number in range(line - 1, max(0, line - 3000), -1):
        above = linecache.getline(file, number)
        stripped = above.lstrip()
        if not stripped or stripped.startswith(("#", "@", ")")):
            continue
        if len(above) - len(stripped) < indent:
            match = re.match(r"class\s+(\w+)", stripped)
            return f"{match[1]}.{name}" if match else name
    return name
