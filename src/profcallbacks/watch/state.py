"""What ``profcallbacks watch`` knows about a log directory, updated from the appended bytes only."""

from __future__ import annotations

import json
import os
import stat
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profcallbacks.core.safefs import read_regular
from profcallbacks.core.timing import median
from profcallbacks.findings import CAPTURE_VERDICT, SYNC_AUDIT
from profcallbacks.layout import (
    META_DIR,
    STAGING_DIR,
    TRACE_FILE,
    parse_capture_dir,
    parse_rank_file,
    run_lock_file,
)
from profcallbacks.watch.rows import finding_row, steps_row
from profcallbacks.watch.tail import JsonlTail
from profcallbacks.watch.verdicts import finding_verdict, report_verdicts

SPARK_POINTS = 240
"""Step summaries kept per rank for the sparkline (older ones are merged pairwise)."""
MAX_FINDINGS = 200
MAX_REPORT_BYTES = 64 << 20
"""Most bytes of a ``--report`` JSON read (it is never a FIFO or a device either)."""
SEARCH_EVERY_S = 5.0
"""Seconds between searches for a run below a directory that holds none itself."""


@dataclass
class RankView:
    """One rank's step summaries as read so far (rows of ``rank<N>.steps.jsonl``)."""

    rank: int
    last: dict[str, Any] = field(default_factory=dict)
    medians_ms: list[float] = field(default_factory=list)
    steps: int = 0
    memory: dict[str, float] = field(default_factory=dict)
    compile_s: float = 0.0  # torch.compile's compile time in the rows read so far

    def add(self, row: dict[str, Any]) -> None:
        """Adds a row checked by ``rows.steps_row`` (finite numbers, whole step counts)."""
        self.last = row
        self.memory.update({k: v for k, v in row.items() if k.endswith("_mb")})
        self.steps += row["steps"]
        self.compile_s += row.get("compile_ms", 0.0) / 1e3
        self.medians_ms.append(row["step_time_ms_median"])
        if len(self.medians_ms) > SPARK_POINTS:  # halve the resolution, keep the whole run
            pairs = zip(self.medians_ms[0::2], self.medians_ms[1::2], strict=False)
            self.medians_ms = [(a + b) / 2 for a, b in pairs]

    @property
    def last_step(self) -> int:
        return int(self.last.get("last_step", -1))

    @property
    def slowdown_ratio(self) -> float | None:
        """The steps file's own ``slowdown_ratio`` when it has one, else the last median step time
        over the median of this rank's interval medians so far."""
        ratio = self.last.get("slowdown_ratio")
        if isinstance(ratio, (int, float)):
            return float(ratio)
        if not self.medians_ms:
            return None
        typical = median(self.medians_ms)
        return self.medians_ms[-1] / typical if typical > 0 else None

    @property
    def memory_mb(self) -> dict[str, float]:
        """The latest memory scalars (``memory_allocated_mb``, ``process_rss_mb``, ...): rows carry
        them only when memory was sampled (at most every ``sample_every_s``)."""
        return self.memory


@dataclass
class CaptureView:
    """One capture directory and, once known, its verdict (``{"kind", "share", ...}``)."""

    name: str
    first_step: int
    trigger: str
    partial: bool
    files: int = 0
    verdict: dict[str, Any] | None = None


class LogdirState:
    """Follows one log directory: per-rank steps, captures and findings.

    Each ``poll`` lists the directory and reads only what was appended to the per-rank files since
    the last poll, so a refresh costs the same at step 100 as at step 1,000,000.

    Example:
        >>> state = LogdirState(Path("runs/not-yet"))  # a job that has not started yet
        >>> state.poll(), state.exists, state.ranks
        (False, False, {})
    """

    def __init__(self, logdir: Path, *, report: Path | None = None) -> None:
        self.given = logdir
        self.logdir = logdir
        self.note: str | None = None
        self._next_search = 0.0
        self.report = report
        self.run_verdict: dict[str, Any] | None = None
        self._report_mtime: float | None = None
        self.ranks: dict[int, RankView] = {}
        self.captures: dict[str, CaptureView] = {}
        self.findings: deque[dict[str, Any]] = deque(maxlen=MAX_FINDINGS)
        self.findings_total = 0
        self._findings_per_rank: dict[int, int] = {}
        self.exporting = False
        self.bad_lines = 0
        self._tails: dict[Path, tuple[JsonlTail, int, str]] = {}
        self._verdicts: dict[str, dict[str, Any]] = {}
        self.checks: dict[int, str] = {}  # per rank: what the sync audit last said it did

    @property
    def exists(self) -> bool:
        return self.logdir.is_dir()

    @property
    def ended(self) -> bool:
        """The run wrote steps or findings and its run marker is gone: it has closed (or was
        killed after its last write; a rank's marker is removed at close)."""
        if not (self.ranks or self.findings_total):
            return False
        try:
            os.lstat(run_lock_file(self.logdir))
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return False

    def poll(self) -> bool:
        """Reads what changed; ``True`` when anything new was found."""
        if not self.exists:
            return self._forget()  # deleted: what it showed is gone too
        changed = self._follow_run_below()
        changed |= self._read_report()
        changed |= self._scan_captures()
        meta = self.logdir / META_DIR
        try:  # never through a link out of the log directory
            names = sorted(p.name for p in meta.iterdir()) if _real_dir(meta) else []
        except OSError:
            names = []
        for name in names:
            parsed = parse_rank_file(name)
            if parsed and meta / name not in self._tails:
                self._tails[meta / name] = (JsonlTail(meta / name), *parsed)
        for tail, rank, what in self._tails.values():
            batch = tail.read()
            self.bad_lines += batch.bad_lines
            if batch.reset:
                changed = True
                if what == "steps":
                    self.ranks.pop(rank, None)
                else:  # the file is read again from its start: forget what it gave before
                    self._drop_findings(rank)
            for raw in batch.rows:
                row = steps_row(raw) if what == "steps" else finding_row(raw)
                if row is None:  # wrong types, numbers out of range: skipped and counted
                    self.bad_lines += 1
                    continue
                changed = True
                if what == "steps":
                    self.ranks.setdefault(rank, RankView(rank)).add(row)
                else:
                    self._add_finding(row)
        return changed

    def _scan_captures(self) -> bool:
        changed = False
        try:
            children = list(self.logdir.iterdir())
        except OSError:
            return False
        exporting = any(c.name == STAGING_DIR and _has_entries(c) for c in children)
        changed |= exporting != self.exporting
        self.exporting = exporting
        present = {c.name for c in children if _real_dir(c)}
        for gone in [name for name in self.captures if name not in present]:
            del self.captures[gone]  # deleted (or replaced by a link): no longer shown
            changed = True
        for child in children:
            parsed = parse_capture_dir(child.name)
            if parsed is None or child.name not in present:
                continue
            view = self.captures.get(child.name)
            if view is None:
                view = self.captures[child.name] = CaptureView(child.name, *parsed)
                view.verdict = self._verdicts.get(child.name)
                changed = True
            files = sum(1 for p in _entries(child) if TRACE_FILE.match(p.name))
            changed |= files != view.files
            view.files = files
        return changed

    def _forget(self) -> bool:
        """The log directory is gone: drop everything read from it; True if anything was shown."""
        had = bool(self.ranks or self.captures or self.findings or self._tails)
        self.ranks.clear()
        self.captures.clear()
        self.findings.clear()
        self.findings_total = 0
        self._findings_per_rank.clear()
        self._tails.clear()
        self.exporting = False
        return had

    def _follow_run_below(self) -> bool:
        """Given a parent of the run (``lightning_logs/``, ``output/``), follows the one run below
        it; with several, says so in ``note``. Looked for until the directory holds a run."""
        if self.logdir != self.given or self._tails or self.captures or (self.given / META_DIR).is_dir():
            return False
        if time.monotonic() < self._next_search:
            return False
        self._next_search = time.monotonic() + SEARCH_EVERY_S
        from profcallbacks.report.read.logdir import find_runs

        try:
            runs = find_runs(self.given)
        except OSError:
            return False
        if len(runs) == 1 and runs[0].root != self.given:
            self.logdir, self.note = runs[0].root, None
            return True
        if len(runs) > 1:
            names = ", ".join(str(r.root.relative_to(self.given)) for r in runs[:4])
            more = " ..." if len(runs) > 4 else ""
            self.note = f"{self.given} holds {len(runs)} runs ({names}{more}): watch one"
        return False

    def _read_report(self) -> bool:
        """Verdicts from a report JSON (``profcallbacks report --format json -o FILE``), re-read when
        the file changes: the run's ``verdict`` and each ``captures[i]["verdict"]``."""
        if self.report is None:
            return False
        try:
            mtime = self.report.stat().st_mtime
            if mtime == self._report_mtime:
                return False
            data = json.loads(read_regular(self.report, max_bytes=MAX_REPORT_BYTES, follow=True))
        except (OSError, ValueError):
            return False  # not there yet, or being rewritten: try again next refresh
        self._report_mtime = mtime
        self.run_verdict, per_capture = report_verdicts(data)
        for name, verdict in per_capture.items():
            self._set_verdict(name, verdict)
        return True

    def _set_verdict(self, name: str, verdict: dict[str, Any]) -> None:
        self._verdicts[name] = verdict
        if name in self.captures:
            self.captures[name].verdict = verdict

    def _drop_findings(self, rank: int) -> None:
        kept = [row for row in self.findings if row.get("rank") != rank]
        self.findings = deque(kept, maxlen=MAX_FINDINGS)
        self.findings_total -= self._findings_per_rank.pop(rank, 0)

    def _add_finding(self, row: dict[str, Any]) -> None:
        self.findings.append(row)
        self.findings_total += 1
        rank = row.get("rank")
        if isinstance(rank, int):
            self._findings_per_rank[rank] = self._findings_per_rank.get(rank, 0) + 1
        if row.get("kind") == SYNC_AUDIT and isinstance(rank, int):
            self.checks[rank] = str(row.get("message", ""))
        if row.get("kind") == CAPTURE_VERDICT:
            found = finding_verdict(row, ((c.name, c.first_step) for c in self.captures.values()))
            if found is not None:
                self._set_verdict(*found)


def _real_dir(path: Path) -> bool:
    """A directory, not a link to one (a link may lead out of the log directory)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _entries(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except OSError:
        return []


def _has_entries(path: Path) -> bool:
    return bool(_entries(path)) if path.is_dir() else False
