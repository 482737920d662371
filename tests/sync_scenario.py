"""User code with known sync points, shared by the sync and contract tests.

Each marked line's number is looked up from its marker, never hard-coded.
"""

from __future__ import annotations

import os

import torch


def scenario_loss(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """A training-step body with exactly two sync points: an ``item()`` and a ``nonzero``."""
    out = model(x)
    loss = out.pow(2).mean()
    positives = (out > 0).nonzero()  # SYNC: nonzero
    value = loss.item()  # SYNC: item
    return loss + 0.0 * positives.numel(), value


def marked_line(marker: str, path: str = __file__) -> int:
    """1-based number of the only line of ``path`` ending with ``# SYNC: <marker>``."""
    with open(path, encoding="utf-8") as f:
        lines = [i for i, line in enumerate(f, 1) if line.rstrip().endswith(f"# SYNC: {marker}")]
    assert len(lines) == 1, (marker, lines)
    return lines[0]


def location(marker: str, path: str = __file__) -> str:
    """``"path/to/file.py:LINE"`` as profcallbacks reports it (relative to the working dir)."""
    return f"{os.path.relpath(path)}:{marked_line(marker, path)}"


EXPECTED = {(location("item"), "item"), (location("nonzero"), "nonzero")}
