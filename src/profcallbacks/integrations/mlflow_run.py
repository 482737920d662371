"""Scalars and findings into an MLflow run."""

from __future__ import annotations

import logging
import time
from typing import Any

from profcallbacks.findings import Finding
from profcallbacks.integrations.base import (
    FINDINGS_KEY,
    VERDICT_KEY,
    CaptureVerdict,
    FindingCounts,
    capture_verdict,
    findings_jsonl,
    require,
)

log = logging.getLogger(__name__)

FINDINGS_ARTIFACT = f"{FINDINGS_KEY}.jsonl"
"""The run's artifact holding every finding, one JSON line each (the findings file's format)."""
CAPTURES_ARTIFACT_DIR = "profcallbacks/captures"
"""Artifact folder of the captures: one subfolder per capture with its trace files."""


def log_capture(client: Any, run_id: str, capture: CaptureVerdict, *, files: bool) -> None:
    """The capture's verdict as the run's tag ``profcallbacks/verdict`` and, with ``files``, its
    traces as artifacts under ``profcallbacks/captures/<capture>``."""
    client.set_tag(run_id, VERDICT_KEY, f"{capture.name}: {capture.verdict}")
    if files:
        for file in capture.files:
            client.log_artifact(run_id, str(file), f"{CAPTURES_ARTIFACT_DIR}/{capture.name}")


class MlflowSink:
    """Logs ``profcallbacks/*`` scalars and findings into an MLflow run.

    Scalars are metrics at their step. Each finding adds one to the metric
    ``profcallbacks/findings/<kind>`` and rewrites the artifact ``profcallbacks/findings.jsonl``
    with all findings so far. Each exported capture's verdict becomes the run's tag
    ``profcallbacks/verdict``, and its trace files the artifact folder
    ``profcallbacks/captures/<capture>``. It writes through an ``MlflowClient`` with the run's
    id, so it works whichever run is active and after the run has ended.

    Args:
        run_id: The run to log into (``None``: ``mlflow.active_run()``).
        client: An ``mlflow.MlflowClient`` (``None``: one for the current tracking URI).
        log_captures: Log each capture's trace files as artifacts (they are within the capture
            byte budget); ``False`` keeps only the verdict tag.

    Raises:
        ValueError: No ``run_id`` is given and no run is active.
        ImportError: ``mlflow`` is not installed (``pip install 'profcallbacks[mlflow]'``).

    Example:
        >>> with mlflow.start_run():                                     # doctest: +SKIP
        ...     with StepProfiler("runs/exp1", metrics_sink=MlflowSink()) as prof:
        ...         for batch in prof.wrap(loader): train_step(batch); prof.step()
    """

    def __init__(self, run_id: str | None = None, *, client: Any = None,
                 log_captures: bool = True) -> None:
        mlflow = require("mlflow", "mlflow", "MlflowSink")
        if run_id is None:
            active = mlflow.active_run()
            if active is None:
                raise ValueError("MlflowSink(run_id=None): no MLflow run is active. Call it "
                                 "inside `with mlflow.start_run():`, or pass run_id=run.info.run_id.")
            run_id = active.info.run_id
        self.run_id: str = run_id
        self._client = client if client is not None else mlflow.MlflowClient()
        self._metric = require("mlflow.entities", "mlflow", "MlflowSink").Metric
        self._counts = FindingCounts()
        self._findings: list[Finding] = []
        self.log_captures = log_captures

    def __call__(self, values: dict[str, float], step: int) -> None:
        self._log(values, step)

    def finding(self, finding: Finding) -> None:
        self._findings.append(finding)
        self._log(self._counts.add(finding), finding.step)
        self._client.log_text(self.run_id, findings_jsonl(self._findings), FINDINGS_ARTIFACT)
        capture = capture_verdict(finding)
        if capture is not None:
            log_capture(self._client, self.run_id, capture, files=self.log_captures)

    def close(self) -> None:
        """Nothing is held back: metrics and the findings artifact are written as they come."""

    def _log(self, values: dict[str, float], step: int) -> None:
        now_ms = int(time.time() * 1000)
        self._client.log_batch(self.run_id, metrics=[self._metric(key, float(value), now_ms, step)
                                                     for key, value in values.items()])
