"""Who this process is in a distributed job: rank, local rank, world size, host."""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass

from profcallbacks.options.checks import check_int, fail


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
        """From ``torch.distributed`` when initialised, else torchrun's or SLURM's environment."""
        host = socket.gethostname().split(".")[0] or "localhost"
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            local = _env_int("LOCAL_RANK", "SLURM_LOCALID", default=0)
            return cls(dist.get_rank(), local, dist.get_world_size(), host)
        rank = _env_int("RANK", "SLURM_PROCID", default=0)
        world = _env_int("WORLD_SIZE", "SLURM_NTASKS", default=1)
        local = _env_int("LOCAL_RANK", "SLURM_LOCALID", default=0)
        return cls(rank, local, world, host)


def _env_int(*names: str, default: int) -> int:
    for name in names:
        value = os.environ.get(name)
        if value is not None and value.strip().isdigit():
            return int(value)
    return default
