"""The shared memory a loader's workers write their timings into, and the main process reads.

One :class:`WorkerRing` per pass over a ``DataLoader`` (per set of worker processes): shared
tensors (``share_memory_()``), so they reach the workers by inheritance under ``fork`` and as file
descriptors under ``spawn``, and nothing is pickled per batch. Each worker owns one row of each:

- ``records[w]``: a ring of the last :data:`RING` batches, one row per batch
  (``SEQ, PASS, IDX, T_GET, T_COLLATE0, T_COLLATE1, T_PUT, T_SEND0, T_SEND1``; times are
  ``time.perf_counter()`` seconds, one clock for every process of the machine). ``SEQ`` is
  written last (the batch's number in the worker, from 1): a row is whole when its ``SEQ`` reads
  the same before and after it is copied.
- ``heads[w]``: the worker's start (``STARTED``: entering ``worker_init_fn``; ``READY``: leaving
  it), its pid, its status, and the sampler's output (``SAMPLE_SEQ`` odd while it is written).
- ``samples[w]``: the sampler's hot lines, JSON, ``SAMPLE_LEN`` bytes.
- ``control``: ``[timing on, sampling on]``, written by the main process, read by every worker.

Example:
    >>> ring = WorkerRing(2)
    >>> ring.records.shape, ring.control.tolist()
    ((2, 512, 9), [0.0, 0.0])
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # the views need numpy at run time only (torch's .numpy())
    import numpy as np

RING = 512
"""Batches each worker's ring holds: the main process reads them before they are overwritten
(at most every ``RING // 2`` batches it fetches)."""
SAMPLE_BYTES = 8192
"""Bytes of the sampler's JSON per worker."""

SEQ, PASS, IDX, T_GET, T_COLLATE0, T_COLLATE1, T_PUT, T_SEND0, T_SEND1 = range(9)
FIELDS = 9
STARTED, READY, PID, STATUS, SAMPLE_SEQ, SAMPLE_LEN = range(6)
HEAD_FIELDS = 6
TIMING, SAMPLING = 0, 1

OK, FAILED = 1.0, -1.0
"""``heads[w, STATUS]``: the worker's hooks are in place, or could not be put in place."""


class WorkerRing:
    """The shared tensors of one set of workers (see the module docstring).

    Args:
        workers: The loader's ``num_workers``.
    """

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._records = torch.zeros(workers, RING, FIELDS, dtype=torch.float64).share_memory_()
        self._heads = torch.zeros(workers, HEAD_FIELDS, dtype=torch.float64).share_memory_()
        self._samples = torch.zeros(workers, SAMPLE_BYTES, dtype=torch.uint8).share_memory_()
        self._control = torch.zeros(2, dtype=torch.float64).share_memory_()
        self._views()

    def _views(self) -> None:
        self.records = self._records.numpy()
        self.heads = self._heads.numpy()
        self.samples = self._samples.numpy()
        self.control = self._control.numpy()

    def __getstate__(self) -> dict[str, Any]:  # the tensors travel, their numpy views do not
        return {"workers": self.workers, "_records": self._records, "_heads": self._heads,
                "_samples": self._samples, "_control": self._control}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._views()

    def read_new(self, worker: int, seen: int) -> tuple[int, list[np.ndarray]]:
        """The rows worker ``worker`` committed after its ``seen``-th batch (those the ring still
        holds, whole), and the count it has committed now."""
        ring = self.records[worker]
        last = int(ring[:, SEQ].max())
        rows = []
        for seq in range(max(seen + 1, last - RING + 1), last + 1):
            row = ring[(seq - 1) % RING].copy()
            if row[SEQ] == seq and ring[(seq - 1) % RING, SEQ] == seq:
                rows.append(row)
        return last, rows

    def hot_lines(self, worker: int) -> dict[str, Any] | None:
        """The sampler's last output for ``worker`` (``None``: none yet, or being written)."""
        head = self.heads[worker]
        for _ in range(3):
            seq = int(head[SAMPLE_SEQ])
            if seq == 0 or seq % 2:
                continue
            raw = bytes(self.samples[worker, :int(head[SAMPLE_LEN])])
            if int(head[SAMPLE_SEQ]) == seq:
                try:
                    value = json.loads(raw)
                except ValueError:
                    return None
                return value if isinstance(value, dict) else None
        return None

    def write_hot_lines(self, worker: int, value: dict[str, Any]) -> None:
        """Publish the sampler's output (in the worker; a seqlock against torn reads)."""
        raw = json.dumps(value, separators=(",", ":")).encode()[:SAMPLE_BYTES]
        head = self.heads[worker]
        seq = int(head[SAMPLE_SEQ])
        head[SAMPLE_SEQ] = seq + 1
        self.samples[worker, :len(raw)] = bytearray(raw)
        head[SAMPLE_LEN] = len(raw)
        head[SAMPLE_SEQ] = seq + 2
