"""Findings into the Hugging Face integrations a ``TrainingArguments.report_to`` enables.

The Trainer's integrations log before a user's callback sees the logs, so scalars and findings
are delivered here, by the backend of each enabled integration, importing only those: W&B
through the run the ``WandbCallback`` opened, MLflow through the ``MLflowCallback``'s active
run, and TensorBoard through the profiler's own event file in the same directory.
"""

from __future__ import annotations

import logging

from profcallbacks.integrations.base import RunLog

log = logging.getLogger(__name__)

SUPPORTED = ("wandb", "mlflow", "tensorboard")
"""The ``report_to`` names that receive findings."""


def report_to_sinks(report_to: list[str] | str | None, *,
                    log_captures: bool = True) -> list[RunLog]:
    """A sink for each enabled integration whose run is open (call after the Trainer's
    ``on_train_begin`` set them up). ``tensorboard`` needs none: the profiler's own event file
    in the Trainer's TensorBoard directory carries findings as text. ``log_captures=False``:
    the sinks log each capture's verdict, not its trace files.

    Example:
        >>> report_to_sinks(["tensorboard"])
        []
    """
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    sinks: list[RunLog] = []
    if "wandb" in names:
        import wandb

        if wandb.run is not None:
            from profcallbacks.integrations.wandb_run import WandbSink

            sinks.append(WandbSink(wandb.run, log_captures=log_captures))
    if "mlflow" in names:
        import mlflow

        if mlflow.active_run() is not None:
            from profcallbacks.integrations.mlflow_run import MlflowSink

            sinks.append(MlflowSink(log_captures=log_captures))
    return sinks

