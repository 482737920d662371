"""Output that hostile log directories cannot subvert: visible control characters, strict JSON.

Names in traces and findings come from the user's program and from whoever can write into the log
directory. Written raw, an ANSI/OSC escape sequence rewrites the terminal (titles, hyperlinks,
cleared screens), U+202E reverses the text after it, and a lone surrogate makes the output
unencodable. :func:`visible` turns each into a visible ``\\xNN`` / ``\\uNNNN`` escape.

Example:
    >>> visible("aten::mm\\x1b[2J\\u202e")
    'aten::mm\\\\x1b[2J\\\\u202e'
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

# C0 and C1 controls except newline and tab, DEL, bidi marks/embeddings/overrides/isolates,
# line/paragraph separators, and lone surrogates.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
                     "\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str) -> str:
    """``text`` with control, bidi-override and surrogate characters as visible escapes."""
    return _UNSAFE.sub(_escape, text)


def json_safe(value: Any, _depth: int = 0) -> Any:
    """``value`` with NaN and infinities as ``None`` and nesting cut at 64 levels.

    ``json.dumps(json_safe(v), allow_nan=False)`` then never fails and never writes the
    ``NaN``/``Infinity`` tokens that strict JSON parsers reject.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if _depth >= 64 and isinstance(value, (dict, list, tuple)):
        return "..."
    if isinstance(value, dict):
        return {str(k): json_safe(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, _depth + 1) for v in value]
    return value


def dumps_strict(value: Any, **kwargs: Any) -> str:
    """Strict JSON text of ``value`` (see :func:`json_safe`); other objects as ``str()``."""
    return json.dumps(json_safe(value), allow_nan=False, default=str, **kwargs)
