"""Tiny models for the torch.compile tests: their lines are what the findings must name."""

from __future__ import annotations

import inspect

import torch
from torch import nn


class Shaped(nn.Module):
    """A linear layer over the last dimension: a new sequence length is a new static shape."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).relu()


class Printing(nn.Module):
    """Prints its loss inside ``forward``: a graph break at that line."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        print("activation sum", y.sum().item())  # the graph break
        return y.relu()


class LoggingInForward(nn.Module):
    """Logs through Lightning's ``rank_zero_info`` inside ``forward``: a graph break inside the
    library (``logging`` is not traced), called from this line."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from lightning.fabric.utilities.rank_zero import rank_zero_info

        y = self.proj(x)
        rank_zero_info("forward")  # the graph break, inside the library
        return y.relu()


def def_line(module: type[nn.Module]) -> int:
    """Line of ``module.forward``'s ``def``."""
    return inspect.getsourcelines(module.forward)[1]


def line_of(module: type[nn.Module], text: str) -> int:
    """Line of the first line of ``module.forward`` that holds ``text``."""
    lines, first = inspect.getsourcelines(module.forward)
    return first + next(k for k, line in enumerate(lines) if text in line)
