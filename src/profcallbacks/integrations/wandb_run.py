"""Scalars and findings into an open Weights & Biases run."""

from __future__ import annotations

import logging
from typing import Any

from profcallbacks.findings import Finding
from profcallbacks.integrations.base import (
    FINDING_COLUMNS,
    FINDINGS_KEY,
    FindingCounts,
    finding_row,
    require,
)

log = logging.getLogger(__name__)

STEP_KEY = "profcallbacks/step"
"""The x-axis of every ``profcallbacks/*`` chart: the profiler's step, not W&B's own ``_step``."""


class WandbSink:
    """Logs ``profcallbacks/*`` scalars and findings into a W&B run you already opened.

    Scalars are logged with their step as ``profcallbacks/step`` (declared as their x-axis), so
    they never move W&B's own step counter or clash with what you log. Each finding adds one to
    ``profcallbacks/findings/<kind>``; at ``close()`` every finding goes into one table,
    ``profcallbacks/findings`` (step, rank, kind, severity, message).

    Args:
        run: The run to log into (``None``: ``wandb.run``, the one ``wandb.init()`` opened).

    Raises:
        ValueError: No run is given and none is open.
        ImportError: ``wandb`` is not installed (``pip install 'profcallbacks[wandb]'``).

    Example:
        >>> run = wandb.init(project="exp1")                            # doctest: +SKIP
        >>> with StepProfiler("runs/exp1", metrics_sink=WandbSink(run)) as prof:  # doctest: +SKIP
        ...     for batch in prof.wrap(loader): train_step(batch); prof.step()
    """

    def __init__(self, run: Any = None) -> None:
        self._wandb = require("wandb", "wandb", "WandbSink")
        self._run = run if run is not None else self._wandb.run
        if self._run is None:
            raise ValueError("WandbSink(run=None): no W&B run is open. Call wandb.init(...) "
                             "first, or pass the run: WandbSink(run=wandb.init(...)).")
        self._run.define_metric(f"{FINDINGS_KEY}/*", step_metric=STEP_KEY)
        self._run.define_metric("profcallbacks/*", step_metric=STEP_KEY)
        self._counts = FindingCounts()
        self._rows: list[list[Any]] = []
        self._closed = False

    def __call__(self, values: dict[str, float], step: int) -> None:
        self._run.log({**values, STEP_KEY: step})

    def finding(self, finding: Finding) -> None:
        self._rows.append(finding_row(finding))
        self._run.log({**self._counts.add(finding), STEP_KEY: finding.step})

    def close(self) -> None:
        """Log the findings table (once); never raises."""
        if self._closed or not self._rows:
            return
        self._closed = True
        try:
            table = self._wandb.Table(columns=FINDING_COLUMNS, data=self._rows)
            self._run.log({FINDINGS_KEY: table})
        except Exception as exc:  # the run may be finished already
            log.warning("profcallbacks: the findings table could not be logged to W&B (%s).", exc)
