"""How the report writes numbers, the same in text and HTML.

Example:
    >>> ms(12.345), pct(0.1234), ms(None), steps(26, 26), steps(24, 26)
    ('12.35 ms', '12.3%', '-', 'step 26', 'steps 24-26')
"""

from __future__ import annotations


def ms(value: float | None) -> str:
    """Milliseconds with two decimals; ``-`` when unknown."""
    return "-" if value is None else f"{value:.2f} ms"


def pct(value: float | None) -> str:
    """A share (0-1) as a percentage with one decimal; ``-`` when unknown."""
    return "-" if value is None else f"{value:.1%}"


def steps(first: object, last: object) -> str:
    """``step 26`` for one step, ``steps 24-26`` for several."""
    return f"step {first}" if first == last else f"steps {first}-{last}"
