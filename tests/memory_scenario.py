"""User code that keeps memory on a known line, shared by the memory and contract tests."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os

import torch

KEPT: list[torch.Tensor] = []


def leaky_step(model: torch.nn.Module, x: torch.Tensor, keep_floats: int,
               device: str = "cpu") -> torch.Tensor:
    """A training-step body that keeps ``keep_floats`` float32 values alive per call."""
    loss = model(x).pow(2).mean()
    KEPT.append(torch.zeros(keep_floats, device=device))  # KEEPS
    return loss


def keep_location() -> str:
    """``"path/to/memory_scenario.py:LINE"`` of the line that keeps the memory."""
    with open(__file__, encoding="utf-8") as f:
        line = next(i for i, text in enumerate(f, 1) if text.rstrip().endswith("# KEEPS"))
    return f"{os.path.relpath(__file__)}:{line}"


def release() -> None:
    """Drop what ``KEPT`` holds and hand freed heap back to the OS (glibc ``malloc_trim``).

    Without it the next test's kept tensors reuse freed, still resident pages and its resident
    memory does not grow: the test would see another process than a fresh one.
    """
    KEPT.clear()
    gc.collect()
    name = ctypes.util.find_library("c")
    if name is not None:
        libc = ctypes.CDLL(name)
        if hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)
