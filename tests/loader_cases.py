"""Datasets and collate functions of the loader-worker tests, each costly at a marked line.

Module-level, so that ``spawn`` workers import them. Every cost is CPU work in a library called
on the marked line (zlib), as decoding is; the training step sleeps, so the workers get the
cores. Each marked line's number is looked up from its marker (``# LOADER: <marker>``), never
hard-coded.
"""

from __future__ import annotations

import time
import zlib
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset


def marked_line(marker: str) -> int:
    """1-based number of the only line of this file ending with ``# LOADER: <marker>``."""
    with open(__file__, encoding="utf-8") as f:
        lines = [i for i, line in enumerate(f, 1) if line.rstrip().endswith(f"# LOADER: {marker}")]
    assert len(lines) == 1, (marker, lines)
    return lines[0]


def _raw(kib: int) -> bytes:
    """``kib`` KiB of bytes that zlib takes its time over."""
    return np.random.default_rng(0).integers(0, 16, kib * 1024, dtype=np.uint8).tobytes()


class SlowDecode(Dataset[torch.Tensor]):
    """Each sample is "decoded" by zlib on one line: ``kib`` KiB of it, about 8 ms of CPU for 100
    KiB here (the library's time counts for that line)."""

    def __init__(self, n: int = 4000, kib: int = 100) -> None:
        self.n = n
        self.raw = _raw(kib)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        packed = zlib.compress(self.raw, 6)  # LOADER: decode
        return torch.full((16,), float(len(packed) % 7 + i))


class Cheap(Dataset[torch.Tensor]):
    """Samples that cost nothing."""

    def __init__(self, n: int = 4000) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((16,), float(i))


class BigArrays(Dataset[torch.Tensor]):
    """Large tensors (16 MiB each, views of arrays loaded once): free to fetch, costly to send."""

    def __init__(self, n: int = 400, mib: int = 16) -> None:
        self.n = n
        self.arrays = [np.full((mib * 1024 * 256,), k, np.float32) for k in range(2)]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.from_numpy(self.arrays[i % 2])


class SlowCollate:
    """A collate_fn that compresses ``kib`` KiB per batch on one line (about 30 ms for 400 KiB)."""

    def __init__(self, kib: int = 400) -> None:
        self.raw = _raw(kib)

    def __call__(self, batch: list[Any]) -> torch.Tensor:
        packed = zlib.compress(self.raw, 6)  # LOADER: collate
        return torch.stack(batch) + len(packed) % 7


class SlowInit:
    """A worker_init_fn that takes ``cost_s`` (opening files, connecting to a store)."""

    def __init__(self, cost_s: float = 0.4) -> None:
        self.cost_s = cost_s

    def __call__(self, worker_id: int) -> None:
        time.sleep(self.cost_s)  # LOADER: init


class SlowDecodeRecords(SlowDecode):
    """:class:`SlowDecode`'s samples as the HF Trainer's records: ``{"x", "labels"}``."""

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:  # type: ignore[override]
        x = super().__getitem__(i)
        return {"x": x, "labels": x.sum()}
