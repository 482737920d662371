"""One way to reject a bad option: ``ValueError`` naming the option, the value and the fix.

Every config (``Schedule``, ``ProfilerConfig``, ``StallConfig``, ...) validates its fields with
these at construction, so a bad value fails before step 1, never hours into training. Wrong types
are a bad value too (``ValueError``, not ``TypeError``), so one ``except ValueError`` catches all.

Example:
    >>> check_int("Schedule", "active", 0, minimum=1, example=3)
    Traceback (most recent call last):
    ...
    ValueError: Schedule(active=0): active must be an int of at least 1. Use e.g. active=3.
"""

from __future__ import annotations

import math
from typing import Any

MAX_INT = 10**9
"""Largest count or step number any option takes: beyond it a value is a typo, and would make
buffers of that size or loops that never end."""


def fail(owner: str, name: str, value: Any, must: str, example: Any = None, *,
         fix: str | None = None) -> ValueError:
    """The error for a bad option: ``Owner(name=value): name must be ... Use e.g. name=example.``"""
    hint = fix if fix is not None else f"Use e.g. {name}={example!r}."
    return ValueError(f"{owner}({name}={value!r}): {name} must be {must}. {hint}")


def check_int(owner: str, name: str, value: Any, *, minimum: int = 0, maximum: int = MAX_INT,
              example: Any = None, fix: str | None = None) -> int:
    """``value`` as an int in ``[minimum, maximum]``; ``bool`` is not an int here."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        huge = isinstance(value, int) and value > maximum
        bound = f"between {minimum} and {maximum}" if maximum != MAX_INT or huge else f"of at least {minimum}"
        raise fail(owner, name, value, f"an int {bound}", example, fix=fix)
    return value


def check_number(owner: str, name: str, value: Any, *, minimum: float | None = None,
                 maximum: float | None = None, above: float | None = None, example: Any = None,
                 fix: str | None = None) -> float:
    """``value`` as a finite float with ``minimum <= value <= maximum`` and ``value > above``."""
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and (minimum is None or value >= minimum) and (maximum is None or value <= maximum)
          and (above is None or value > above))
    if not ok:
        bounds = [text for text, bound in ((f"at least {minimum}", minimum), (f"above {above}", above),
                                           (f"at most {maximum}", maximum)) if bound is not None]
        must = "a finite number" + (" " + " and ".join(bounds) if bounds else "")
        raise fail(owner, name, value, must, example, fix=fix)
    return float(value)


def check_type(owner: str, name: str, value: Any, expected: type | tuple[type, ...], what: str,
               example: str) -> Any:
    """``value`` is an instance of ``expected`` (``what`` says so in words, e.g. "a StallConfig")."""
    if isinstance(value, bool) and bool not in (expected if isinstance(expected, tuple) else (expected,)):
        raise fail(owner, name, value, what, fix=f"Use e.g. {name}={example}.")
    if not isinstance(value, expected):
        raise fail(owner, name, value, what, fix=f"Use e.g. {name}={example}.")
    return value


def check_bool(owner: str, name: str, value: Any) -> bool:
    """``value`` is ``True`` or ``False`` (not a string such as ``"false"``, which is truthy)."""
    if not isinstance(value, bool):
        raise fail(owner, name, value, "True or False", True)
    return value
