"""Findings into a Lightning Trainer's own loggers (its scalars already go through them)."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.loggers import Logger, MLFlowLogger, TensorBoardLogger, WandbLogger

from profcallbacks.findings import Finding, finding_markdown
from profcallbacks.integrations import mlflow_run, wandb_run
from profcallbacks.integrations.base import (
    FINDING_COLUMNS,
    FINDINGS_KEY,
    FindingCounts,
    capture_verdict,
    finding_row,
    findings_jsonl,
)
from profcallbacks.integrations.mlflow_run import FINDINGS_ARTIFACT


class LoggerFindings:
    """Hands each finding to one Lightning ``Logger``, in the richest form it takes.

    Every logger gets ``profcallbacks/findings/<kind>`` (a count) through ``log_metrics`` at
    the finding's step: a ``CSVLogger`` writes it as a column of ``metrics.csv``. On top:
    ``TensorBoardLogger`` gets the message as text (``profcallbacks/findings/<kind>``),
    ``MLFlowLogger`` the artifact ``profcallbacks/findings.jsonl``, ``WandbLogger`` the table
    ``profcallbacks/findings`` at the end of the fit. ``WandbLogger`` and ``MLFlowLogger`` also
    get each capture's verdict (summary / tag ``profcallbacks/verdict``) and, with
    ``log_captures``, its trace files (as ``WandbSink`` and ``MlflowSink`` log them). Loggers log
    on global rank zero only.

    Example:
        >>> from lightning.pytorch.loggers import CSVLogger
        >>> sink = LoggerFindings(CSVLogger(getfixture("tmp_path")))
        >>> sink(Finding("sync_point", step=4, rank=0, severity="warning", message="item()"))
    """

    def __init__(self, logger: Logger, *, log_captures: bool = True) -> None:
        self.logger = logger
        self.log_captures = log_captures
        self._counts = FindingCounts()
        self._findings: list[Finding] = []

    def __repr__(self) -> str:
        return f"LoggerFindings({type(self.logger).__name__})"

    def __call__(self, finding: Finding) -> None:
        logger = self.logger
        self._findings.append(finding)
        logger.log_metrics(self._counts.add(finding), step=finding.step)
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_text(f"{FINDINGS_KEY}/{finding.kind}", finding_markdown(finding),
                                       global_step=finding.step)
        elif isinstance(logger, MLFlowLogger) and logger.run_id is not None:
            logger.experiment.log_text(logger.run_id, findings_jsonl(self._findings),
                                       FINDINGS_ARTIFACT)
        capture = capture_verdict(finding)
        if capture is None:
            return
        if isinstance(logger, MLFlowLogger) and logger.run_id is not None:
            mlflow_run.log_capture(logger.experiment, logger.run_id, capture, files=self.log_captures)
        elif isinstance(logger, WandbLogger):
            import wandb

            wandb_run.log_capture(wandb, logger.experiment, capture, files=self.log_captures)

    def close(self) -> None:
        """Write the W&B table and flush the logger (a ``CSVLogger`` writes its file then)."""
        logger: Any = self.logger
        if isinstance(logger, WandbLogger) and self._findings:
            logger.log_table(FINDINGS_KEY, columns=FINDING_COLUMNS,
                             data=[finding_row(f) for f in self._findings])
        logger.save()
