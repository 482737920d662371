"""When a rank counts as a straggler: the options of the cross-rank check."""

from __future__ import annotations

from dataclasses import dataclass

from profcallbacks.options.checks import check_int, check_number

STRAGGLER_THRESHOLD = 1.15
"""A rank 15% slower than the others' median holds every rank back by as much at each all-reduce."""


@dataclass(frozen=True, kw_only=True)
class StragglerConfig:
    """When a rank counts as a straggler.

    Args:
        every_n_steps: Steps between checks; each check is one all_gather of 3 floats per rank.
        threshold: A rank's median step time over the other ranks' median that counts as slow.
        consecutive: Checks in a row a rank must be slow in before it is reported.
        min_steps: Fewest eligible steps a rank needs in a check for it to be judged.

    Example:
        >>> from profcallbacks import SlowdownConfig
        >>> SlowdownConfig(straggler=StragglerConfig(every_n_steps=500)).straggler.threshold
        1.15
    """

    every_n_steps: int = 200
    threshold: float = STRAGGLER_THRESHOLD
    consecutive: int = 2
    min_steps: int = 10

    def __post_init__(self) -> None:
        owner = "StragglerConfig"
        check_int(owner, "every_n_steps", self.every_n_steps, minimum=2, example=200)
        check_int(owner, "consecutive", self.consecutive, minimum=1, maximum=10_000, example=2)
        check_int(owner, "min_steps", self.min_steps, minimum=1, example=10)
        check_number(owner, "threshold", self.threshold, above=1.0, maximum=100.0,
                     fix="Use e.g. threshold=1.15 (a ratio of step times).")
