"""Scalars and findings into an open Weights & Biases run."""

from __future__ import annotations

import logging
from typing import Any

from profcallbacks.findings import Finding
from profcallbacks.integrations.base import (
    FINDING_COLUMNS,
    FINDINGS_KEY,
    VERDICT_KEY,
    CaptureVerdict,
    FindingCounts,
    capture_verdict,
    finding_row,
    require,
)

log = logging.getLogger(__name__)

STEP_KEY = "profcallbacks/step"
"""The x-axis of every ``profcallbacks/*`` chart: the profiler's step, not W&B's own ``_step``."""


def log_capture(wandb: Any, run: Any, capture: CaptureVerdict, *, files: bool) -> None:
    """The capture's verdict into the run's summary (``profcallbacks/verdict``) and, with
    ``files``, its traces as an artifact of type ``profile`` (``profcallbacks-<capture>``)."""
    run.summary[VERDICT_KEY] = f"{capture.name}: {capture.verdict}"
    if files and capture.files:
        artifact = wandb.Artifact(f"profcallbacks-{capture.name}", type="profile",
                                  metadata={"verdict": capture.verdict})
        for file in capture.files:
            artifact.add_file(str(file), name=file.name)
        run.log_artifact(artifact)


class WandbSink:
    """Logs ``profcallbacks/*`` scalars and findings into a W&B run you already opened.

    Scalars are logged with their step as ``profcallbacks/step`` (declared as their x-axis), so
    they never move W&B's own step counter or clash with what you log. Each finding adds one to
    ``profcallbacks/findings/<kind>``; at ``close()`` every finding goes into one table,
    ``profcallbacks/findings`` (step, rank, kind, severity, message). Each exported capture's
    verdict becomes the run's summary ``profcallbacks/verdict``, and its trace files an artifact of
    type ``profile`` named ``profcallbacks-<capture>`` (what W&B's trace viewer opens).

    Args:
        run: The run to log into (``None``: ``wandb.run``, the one ``wandb.init()`` opened).
        log_captures: Log each capture's trace files as an artifact (they are within the capture
            byte budget); ``False`` keeps only the verdict.

    Raises:
        ValueError: No run is given and none is open.
        ImportError: ``wandb`` is not installed (``pip install 'profcallbacks[wandb]'``).

    Example:
        >>> run = wandb.init(project="exp1")                            # doctest: +SKIP
        >>> with StepProfiler("runs/exp1", metrics_sink=WandbSink(run)) as prof:  # doctest: +SKIP
        ...     for batch in prof.wrap(loader): train_step(batch); prof.step()
    """

    def __init__(self, run: Any = None, *, log_captures: bool = True) -> None:
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
        self.log_captures = log_captures

    def __call__(self, values: dict[str, float], step: int) -> None:
        self._run.log({**values, STEP_KEY: step})

    def finding(self, finding: Finding) -> None:
        self._rows.append(finding_row(finding))
        self._run.log({**self._counts.add(finding), STEP_KEY: finding.step})
        capture = capture_verdict(finding)
        if capture is not None:
            log_capture(self._wandb, self._run, capture, files=self.log_captures)

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
