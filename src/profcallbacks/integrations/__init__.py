"""Scalars and findings into the experiment trackers a run already logs to.

One backend per module, each importing its package only when used: :mod:`.wandb_run` (an open
W&B run), :mod:`.mlflow_run` (an MLflow run), :mod:`.lightning_loggers` (the Trainer's own
loggers) and :mod:`.report_to` (the Hugging Face integrations named in ``report_to``).
"""
