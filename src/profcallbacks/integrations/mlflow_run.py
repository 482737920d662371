"""Scalars and findings into an MLflow run."""

from __future__ import annotations

import logging
import time
from typing import Any

from profcallbacks.findings import Finding
from profcallbacks.integrations.base import FINDINGS_KEY, FindingCounts, findings_jsonl, require

log = logging.getLogger(__name__)

FINDINGS_ARTIFACT = f"{FINDINGS_KEY}.jsonl"
"""The run's artifact holding every finding, one JSON line each (the findings file's format)."""


class MlflowSink:
    """Logs ``profcallbacks/*`` scalars and findings into an MLflow run.

    Scalars are metrics at their step. Each finding adds one to the metric
    ``profcallbacks/findings/<kind>`` and rewrites the artifact ``profcallbacks/findings.jsonl``
    with all findings so far. It writes through an ``MlflowClient`` with the run's id, so it
    works whichever run is active and after the run has ended.

    Args:
        run_id: The run to log into (``None``: ``mlflow.active_run()``).
        client: An ``mlflow.MlflowClient`` (``None``: one for the current tracking URI).

    Raises:
        ValueError: No ``run_id`` is given and no run is active.
        ImportError: ``mlflow`` is not installed (``pip install 'profcallbacks[mlflow]'``).

    Example:
        >>> with mlflow.start_run():                                     # doctest: +SKIP
        ...     with StepProfiler("runs/exp1", metrics_sink=MlflowSink()) as prof:
        ...         for batch in prof.wrap(loader): train_step(batch); prof.step()
    """

    def __init__(self, run_id: str | None = None, *, client: Any = None) -> None:
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

    def __call__(self, values: dict[str, float], step: int) -> None:
        self._log(values, step)

    def finding(self, finding: Finding) -> None:
        self._findings.append(finding)
        self._log(self._counts.add(finding), finding.step)
        self._client.log_text(self.run_id, findings_jsonl(self._findings), FINDINGS_ARTIFACT)

    def close(self) -> None:
        """Nothing is held back: metrics and the findings artifact are written as they come."""

    def _log(self, values: dict[str, float], step: int) -> None:
        now_ms = int(time.time() * 1000)
        self._client.log_batch(self.run_id, metrics=[self._metric(key, float(value), now_ms, step)
                                                     for key, value in values.items()])
