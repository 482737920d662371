"""What follows a capture's publication, in the process that published it: the merged trace of
all ranks, then the log directory's byte budget."""

from __future__ import annotations

import logging
from pathlib import Path

from profcallbacks.capture.merge import merge_capture
from profcallbacks.capture.merge_choice import merge_choice
from profcallbacks.capture.retention import Retention
from profcallbacks.core.faults import describe_error
from profcallbacks.layout import TRACE_FILE, merged_file_name, parse_capture_dir
from profcallbacks.options.budget import ByteBudget

log = logging.getLogger(__name__)


class AfterPublish:
    """Merges the ranks' traces of each published capture and keeps the log directory in budget.

    Example:
        >>> after = AfterPublish(Path("runs/x"), ByteBudget())
        >>> after(Path("runs/x/step000004-schedule"), "schedule", [])  # nothing of ours: no-op
    """

    def __init__(self, logdir: Path, budget: ByteBudget | None) -> None:
        self._budget = budget
        self._retention = (Retention(logdir, logdir_bytes=budget.logdir_bytes)
                           if budget is not None and budget.logdir_bytes is not None else None)

    def __call__(self, directory: Path, trigger: str, files: list[str]) -> None:
        """``files`` of capture ``directory`` were just published here; never raises."""
        if not files:
            return
        retention = self._retention
        if retention is not None:
            retention.add(directory, trigger, files)
        merged = self._merge(directory, files)
        if retention is not None:
            if merged is not None:
                retention.add(directory, trigger, [merged])
            try:
                retention.enforce()
            except Exception as exc:  # the budget is never worth a failed run
                log.warning("profcallbacks: keeping the log directory within its budget failed "
                            "(%s: %s).", type(exc).__name__, exc)

    def _merge(self, directory: Path, files: list[str]) -> str | None:
        budget = self._budget
        traces = sorted(directory / f for f in files if TRACE_FILE.match(f))
        parsed = parse_capture_dir(directory.name)
        if budget is None or not budget.merge_ranks or len(traces) < 2 or parsed is None:
            return None
        name = merged_file_name(parsed[0])
        traces = merge_choice(traces)  # a large capture: its slowest ranks and a median one
        try:
            meta = merge_capture(traces, directory / name, budget_bytes=budget.capture_bytes)
        except FileExistsError:
            return None  # merged already (another rank of this run published into it)
        except Exception as exc:
            log.warning("profcallbacks: could not merge the ranks of capture %s (%s).",
                        directory.name, describe_error(exc, directory))
            return None
        skew = meta.get("max_residual_skew_us")
        log.info("profcallbacks: merged %d ranks of capture %s into %s (%.1f MB; clocks aligned "
                 "on %d collectives, residual skew %s us%s).", len(traces), directory.name, name,
                 meta["bytes"] / 1e6, meta["collectives_matched"], skew,
                 "; reduced to fit its budget" if meta["reduced"] else "")
        return name
