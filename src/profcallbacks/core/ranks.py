"""Who this process is in a distributed job: rank, local rank, world size, host."""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from profcallbacks.options.checks import check_int, fail

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RankInfo:
    """Identity of this process in the job.

    Example:
        >>> RankInfo(rank=3, local_rank=1, world_size=8, host="node-b").worker
        'rank3_node-b'
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    host: str = "localhost"

    def __post_init__(self) -> None:
        check_int("RankInfo", "world_size", self.world_size, minimum=1, example=8)
        check_int("RankInfo", "rank", self.rank, minimum=0, maximum=self.world_size - 1,
                  fix=f"Use a global rank below world_size={self.world_size}, e.g. rank=0.")
        check_int("RankInfo", "local_rank", self.local_rank, minimum=0, example=0)
        if not isinstance(self.host, str) or not self.host:
            raise fail("RankInfo", "host", self.host, "a non-empty host name", "node-a")

    @property
    def worker(self) -> str:
        """Worker name for trace files: global rank and host, unique across nodes.

        Dots are replaced so the TensorBoard plugin never mistakes part of a host name for a
        span number.
        """
        host = re.sub(r"[^A-Za-z0-9_-]", "-", self.host)
        return f"rank{self.rank}_{host}"

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @classmethod
    def detect(cls) -> RankInfo:
        """From ``torch.distributed`` when initialised, else a launcher's complete set of variables
        (:func:`launcher_ranks`), else one rank."""
        host = socket.gethostname().split(".")[0] or "localhost"
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            local = _env_int("LOCAL_RANK", "SLURM_LOCALID", default=0)
            return cls(dist.get_rank(), local, dist.get_world_size(), host)
        launched = launcher_ranks(os.environ)
        if launched is None:
            return cls(0, 0, 1, host)
        rank, world = launched
        local = _env_int("LOCAL_RANK", "SLURM_LOCALID", default=0)
        return cls(rank, local, world, host)


_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS",
                  "SLURM_STEP_NUM_TASKS")
_warned: set[tuple[tuple[str, str], ...]] = set()


def launcher_ranks(env: Mapping[str, str]) -> tuple[int, int] | None:
    """``(rank, world_size)`` from a launcher's complete set of variables, without a process group.

    Trusted: torchrun's ``RANK`` with ``WORLD_SIZE``, or an srun step's ``SLURM_PROCID`` with
    ``SLURM_STEP_NUM_TASKS``, the rank below the world size. A Slurm batch script (run once, with
    ``SLURM_NTASKS=4 SLURM_PROCID=0`` and no step), a stray ``RANK`` or a mix of launchers is no
    set of processes that exist: one warning naming the variables, and ``None`` (one rank).

    Example:
        >>> launcher_ranks({"RANK": "1", "WORLD_SIZE": "2"})
        (1, 2)
        >>> launcher_ranks({"SLURM_NTASKS": "4", "SLURM_PROCID": "0"}) is None  # sbatch
        True
    """
    for rank_var, world_var in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS")):
        rank, world = _int(env.get(rank_var)), _int(env.get(world_var))
        if rank is not None and world is not None and 0 <= rank < world:
            return (rank, world) if world > 1 else None
    seen = tuple((name, env[name]) for name in _LAUNCHER_VARS if name in env)
    if any(_claims_several(name, value) for name, value in seen) and seen not in _warned:
        _warned.add(seen)  # once per process for this environment
        log.warning("profcallbacks: %s, but torch.distributed has no process group and these "
                    "are no complete launcher set (torchrun's RANK with WORLD_SIZE, or an srun "
                    "step's SLURM_PROCID with SLURM_STEP_NUM_TASKS); profiling goes on as a "
                    "single rank. Initialise the process group before profiling starts to "
                    "profile each rank.", " ".join(f"{n}={v}" for n, v in seen))
    return None


def _claims_several(name: str, value: str) -> bool:
    """The variable says this process is one of several (a rank above 0, a world above 1)."""
    if name == "LOCAL_RANK":
        return False
    number = _int(value)
    return number is None or number > (0 if name in ("RANK", "SLURM_PROCID") else 1)


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.strip().isdigit() else None


def _env_int(*names: str, default: int) -> int:
    for name in names:
        value = _int(os.environ.get(name))
        if value is not None:
            return value
    return default
