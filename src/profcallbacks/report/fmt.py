"""How the report writes numbers, the same in text and HTML.

Example:
    >>> ms(12.345), pct(0.1234), ms(None)
    ('12.35 ms', '12.3%', '-')
"""

from __future__ import annotations


def ms(value: float | None) -> str:
    """Milliseconds with two decimals; ``-`` when unknown."""
    return "-" if value is None else f"{value:.2f} ms"


def pct(value: float | None) -> str:
    """A share (0-1) as a percentage with one decimal; ``-`` when unknown."""
    return "-" if value is None else f"{value:.1%}"
