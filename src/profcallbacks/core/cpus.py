"""The CPU cores this process may use, and the one worker-count rule every loader advice follows.

Example:
    >>> loader_workers(2), loader_workers(64)
    (2, 8)
"""

from __future__ import annotations

import os

MAX_WORKERS = 8
"""More loader workers than this rarely help and each holds a copy of the dataset object."""


def usable_cpus() -> int:
    """The CPU cores this process may use (its affinity mask: a container's or a job's share),
    not the machine's count."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 1


def loader_workers(cpus: int | None = None) -> int:
    """The one worker-count rule of every piece of loader advice, live and in the report: one
    worker per core this process may use (a worker waiting on I/O needs no core of its own, one
    building a batch needs one while the training thread waits for it), at most ``MAX_WORKERS``.

    Args:
        cpus: The cores the training process may use; ``None``: this process's.
    """
    return max(1, min(MAX_WORKERS, usable_cpus() if cpus is None else cpus))
