"""How many bytes traces may take on disk: per capture (each rank's file) and per log directory."""

from __future__ import annotations

from dataclasses import dataclass

from profcallbacks.options.checks import check_bool, check_int

MB = 1_000_000
MIN_BUDGET_BYTES = 10_000
"""Smallest budget accepted: below it not even one step of a tiny model fits."""
MAX_BUDGET_BYTES = 10**15


@dataclass(frozen=True, kw_only=True)
class ByteBudget:
    """Bounds on trace bytes, so that every capture stays openable and a long run fits its disk.

    Args:
        capture_bytes: Most bytes one rank's trace file of a capture may take on disk (gzipped);
            predicted before each window opens and met by trimming it (fewer active steps, then
            ``with_stack``, then ``record_shapes``, then ``profile_memory``). ``None``: off.
        logdir_bytes: Most bytes all capture directories of the log directory may take; the
            oldest captures of least value that this run wrote go first. ``None``: off.
        merge_ranks: With several ranks, write one merged trace of all ranks per capture
            (``all-ranks.<step>.trace.json.gz``), itself held to ``capture_bytes``.

    Example:
        >>> ByteBudget(capture_bytes=20_000_000).logdir_bytes
        2000000000
    """

    capture_bytes: int | None = 100 * MB
    logdir_bytes: int | None = 2000 * MB
    merge_ranks: bool = True

    def __post_init__(self) -> None:
        for name in ("capture_bytes", "logdir_bytes"):
            value = getattr(self, name)
            if value is not None:
                check_int("ByteBudget", name, value, minimum=MIN_BUDGET_BYTES,
                          maximum=MAX_BUDGET_BYTES,
                          fix=f"Use e.g. {name}={100 * MB if name == 'capture_bytes' else 2000 * MB}"
                              f" (bytes), or {name}=None for no bound.")
        check_bool("ByteBudget", "merge_ranks", self.merge_ranks)
        if (self.capture_bytes is not None and self.logdir_bytes is not None
                and self.logdir_bytes < self.capture_bytes):
            check_int("ByteBudget", "logdir_bytes", self.logdir_bytes, minimum=self.capture_bytes,
                      fix="The log directory must hold at least one capture: raise logdir_bytes "
                          "or lower capture_bytes.")
