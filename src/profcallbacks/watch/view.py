"""Renders a ``LogdirState`` as rich renderables: ranks, captures and findings."""

from __future__ import annotations

import statistics
import time
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from profcallbacks.core.timing import median
from profcallbacks.findings import DATALOADER_STALL
from profcallbacks.report.render.safe import visible
from profcallbacks.watch.rows import MAX_NAME, finite, loader_workers, text
from profcallbacks.watch.state import LogdirState, RankView

SPARK = "▁▂▃▄▅▆▇█"
SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
_MEMORY_LABELS = {"memory_allocated_mb": "alloc", "memory_reserved_mb": "reserved",
                  "max_memory_allocated_mb": "peak", "memory_peak_mb": "peak",
                  "process_rss_mb": "rss"}


def sparkline(values: list[float], width: int = 30) -> str:
    """``values`` as block characters, averaged into ``width`` buckets; lowest to highest.

    Example:
        >>> sparkline([1.0, 2.0, 3.0, 4.0], width=4)
        '▁▃▆█'
    """
    if not values:
        return ""
    if len(values) > width:
        size = len(values) / width
        values = [statistics.fmean(values[int(i * size):max(int((i + 1) * size), int(i * size) + 1)])
                  for i in range(width)]
    low, high = min(values), max(values)
    span = high - low
    if span <= 0:
        return SPARK[0] * len(values)
    return "".join(SPARK[min(int((v - low) / span * (len(SPARK) - 1) + 0.5), len(SPARK) - 1)]
                   for v in values)


def render(state: LogdirState, *, max_rank_rows: int = 16, max_findings: int = 8,
           max_captures: int = 8, now: float | None = None) -> RenderableType:
    """One frame: header, per-rank table, captures (newest first), findings (latest step
    first).

    Every string read from the log directory goes to rich as ``Text`` (never parsed as markup),
    made visible first: a finding cannot style, link or rewrite the terminal.
    """
    logdir = visible(str(state.logdir))
    stamp = time.strftime("%H:%M:%S", time.localtime(now))
    if not state.exists:
        return Text(f"profcallbacks watch {logdir}  {stamp}\n"
                    f"waiting for {logdir} to appear (Ctrl-C to stop)")
    last = max((r.last_step for r in state.ranks.values()), default=-1)
    header = Text(f"profcallbacks watch {logdir}  {stamp}  ", style="bold")
    header.append(f"ranks {len(state.ranks)}  step {last if last >= 0 else '-'}  "
                  f"captures {len(state.captures)}  findings {state.findings_total}", style="")
    compile_s = sum(r.compile_s for r in state.ranks.values())
    if compile_s:
        header.append(f"  compiling {compile_s:.1f} s", style="yellow")
    if state.run_verdict and state.run_verdict.get("kind"):
        header.append(f"  verdict {_verdict(state.run_verdict)}", style="bold magenta")
    if state.exporting:
        header.append("  (exporting a capture)", style="magenta")
    elif state.ended:
        header.append("  run ended", style="bold green")
    parts: list[RenderableType] = [header]
    if state.note:
        parts.append(Text(visible(state.note), style="yellow"))
    if state.checks:  # which checks ran and when (the first rank's word for all)
        parts.append(Text(f"checks: {state.checks[min(state.checks)]}", style="dim"))  # checked row
    parts.append(_ranks_table(state, max_rank_rows))
    workers = _workers_table(state)
    if workers is not None:  # an input-bound run: where its loader workers' time goes
        parts.append(workers)
    parts.append(_captures_table(state, max_captures))
    parts.append(_findings_table(state, max_findings))
    if state.bad_lines:
        parts.append(Text(f"skipped {state.bad_lines} unreadable line(s)", style="dim"))
    return Group(*parts)


def _ranks_table(state: LogdirState, max_rows: int) -> RenderableType:
    if not state.ranks:
        return Text("no step summaries yet (profcallbacks/rank*.steps.jsonl)", style="dim")
    memory = any(r.memory_mb for r in state.ranks.values())
    table = Table(title="Steps (last summary)", title_justify="left", expand=False)
    for name, justify in (("rank", "right"), ("step", "right"), ("median ms", "right"),
                          ("mean ms", "right"), ("max ms", "right"), ("run trend", "left"),
                          ("data wait", "right"), ("vs run", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    if memory:
        table.add_column("memory MB")
    ranks = sorted(state.ranks.values(), key=lambda r: r.rank)
    if len(ranks) > max_rows:
        table.add_row(*_summary_row(ranks, memory), style="bold")
        slowest = sorted(ranks, key=lambda r: -_num(r.last.get("step_time_ms_median")))
        ranks = sorted(slowest[:max(max_rows - 1, 1)], key=lambda r: -_num(r.last.get("step_time_ms_median")))
        table.caption = f"{len(state.ranks)} ranks: all-rank summary, then the {len(ranks)} slowest"
    for view in ranks:
        table.add_row(*_rank_row(view, memory))
    return table


def _rank_row(view: RankView, memory: bool) -> list[RenderableType]:
    row = view.last
    ratio = view.slowdown_ratio
    ratio_text = Text("-" if ratio is None else f"{ratio:.2f}x",
                      style="red" if ratio and ratio >= 1.5 else "yellow" if ratio and ratio >= 1.2 else "")
    share = row.get("data_wait_share")
    share_text = Text("-" if not isinstance(share, (int, float)) else f"{share:.0%}",
                      style="yellow" if isinstance(share, (int, float)) and share >= 0.2 else "")
    cells: list[RenderableType] = [str(view.rank), str(view.last_step), _ms(row.get("step_time_ms_median")),
                                   _ms(row.get("step_time_ms")), _ms(row.get("step_time_ms_max")),
                                   sparkline(view.medians_ms), share_text, ratio_text]
    if memory:
        cells.append(Text(" ".join(f"{_MEMORY_LABELS.get(k, k.removesuffix('_mb'))} {v:,.0f}"
                                   for k, v in view.memory_mb.items())))
    return cells


def _summary_row(ranks: list[RankView], memory: bool) -> list[RenderableType]:
    medians = [_num(r.last.get("step_time_ms_median")) for r in ranks]
    shares = [_num(r.last.get("data_wait_share")) for r in ranks]
    cells: list[RenderableType] = [
        f"all {len(ranks)}", str(min(r.last_step for r in ranks)),
        f"{median(medians):.2f}", f"{min(medians):.2f}-{max(medians):.2f}",
        _ms(max(_num(r.last.get("step_time_ms_max")) for r in ranks)), "",
        f"{median(shares):.0%}", ""]
    if memory:
        rss = [r.memory_mb for r in ranks if r.memory_mb]
        keys = sorted({k for m in rss for k in m})
        cells.append(" ".join(f"max {_MEMORY_LABELS.get(k, k)} {max(m.get(k, 0.0) for m in rss):,.0f}"
                              for k in keys[:2]))
    return cells


def _workers_table(state: LogdirState) -> RenderableType | None:
    """The per-worker table of the latest ``dataloader_stall`` that has one."""
    found = next((checked for f in reversed(state.findings) if f.get("kind") == DATALOADER_STALL
                  and (checked := loader_workers(f.get("details") or {})) is not None), None)
    if found is None:
        return None
    rate = (f"{found['build_per_s']:.1f} batches/s built, {found['consume_per_s']:.1f}/s consumed"
            if found["build_per_s"] is not None and found["consume_per_s"] is not None else "")
    table = Table(title=f"Loader workers (largest part: {found['part']}"
                  + (f"; {found['needed']} workers would keep up" if found["needed"] else "")
                  + ")", title_justify="left")
    keys = ["fetch_ms", "collate_ms", "send_ms", "transfer_ms", "pin_ms", "per_s"]
    if not any((row.get("pin_ms") or 0) > 0 for row in found["rows"]):
        keys.remove("pin_ms")  # pin_memory=False, or no accelerator: nothing pinned
    for name in ("worker", "batches", *(k.replace("_ms", " ms").replace("per_s", "batches/s")
                                        for k in keys)):
        table.add_column(name, justify="right")
    for row in found["rows"]:
        table.add_row(str(row["worker"]), str(row.get("batches") or "-"),
                      *(_ms(row.get(key)) for key in keys))
    table.caption = Text("; ".join(x for x in (rate, found["line"]) if x))
    return table


def _captures_table(state: LogdirState, limit: int) -> RenderableType:
    if not state.captures:
        return Text("no captures yet", style="dim")
    table = Table(title="Captures (newest first)", title_justify="left")
    for name in ("capture", "trigger", "first step", "traces", "verdict", "top diagnoses"):
        table.add_column(name)
    newest = sorted(state.captures.values(), key=lambda c: (c.first_step, c.name), reverse=True)
    for c in newest[:limit]:
        table.add_row(Text(visible(c.name)), Text(visible(c.trigger) + (" (partial)" if c.partial else "")),
                      str(c.first_step), str(c.files), Text(_verdict(c.verdict) if c.verdict else "-"),
                      Text(_diagnoses(c.verdict) if c.verdict else "-"))
    if len(newest) > limit:
        table.caption = f"{len(newest) - limit} older not shown"
    return table


def in_step_order(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The latest steps first, runs of the directory in the order they came (a verdict the
    export helper made for an earlier capture sits at that capture's step, not at the top).

    Example:
        >>> rows = [{"step": 26, "kind": "dataloader_stall"}, {"step": 24, "kind": "capture_verdict"}]
        >>> [r["step"] for r in in_step_order(rows)]
        [26, 24]
    """
    runs: dict[Any, int] = {}
    for row in findings:
        runs.setdefault(row.get("run"), len(runs))

    def key(row: dict[str, Any]) -> tuple[int, int]:
        step = row.get("step")
        return runs[row.get("run")], step if isinstance(step, int) else -1

    return sorted(findings[::-1], key=key, reverse=True)  # stable: the newest of a step first


def _findings_table(state: LogdirState, limit: int) -> RenderableType:
    if not state.findings:
        return Text("no findings yet", style="dim")
    table = Table(title="Findings (latest step first)", title_justify="left")
    for name in ("step", "rank", "severity", "kind", "message"):
        table.add_column(name, overflow="fold" if name == "message" else "ellipsis")
    for f in in_step_order(list(state.findings))[:limit]:
        severity = str(f.get("severity", "info"))
        message = str(f.get("message", ""))
        table.add_row(str(f.get("step", "-")), str(f.get("rank", "-")),
                      Text(severity, style=SEVERITY_STYLE.get(severity, "")),
                      Text(str(f.get("kind", "?")), style=SEVERITY_STYLE.get(severity, "")),
                      Text(message if len(message) <= 160 else message[:157] + "..."))
    return table


def _diagnoses(verdict: dict[str, Any], limit: int = 3) -> str:
    """``kind (up to N ms)`` of a verdict's top diagnoses, or ``-``."""
    rows = verdict.get("diagnoses")
    if not isinstance(rows, list):
        return "-"
    out = [text(d.get("kind"), MAX_NAME) + (f" ({gain:.1f} ms)" if (gain := finite(d.get("gain_ms")))
                                             is not None else "")
           for d in rows[:limit] if isinstance(d, dict)]
    return ", ".join(out) or "-"


def _verdict(verdict: dict[str, Any]) -> str:
    share = finite(verdict.get("share"))
    return text(verdict.get("kind"), MAX_NAME) + (f" ({share:.0%})" if share is not None else "")


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def _ms(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "-"
