"""Step time over the run as inline SVG: no scripts, fonts or images, so it renders offline."""

from __future__ import annotations

from html import escape
from typing import Any

from profcallbacks.findings import (
    CAPTURE_VERDICT,
    DATALOADER_STALL,
    DATALOADER_STALL_CLEARED,
    DATALOADER_WAIT,
    MEMORY_CREEP,
    MEMORY_SITES,
    OUT_OF_MEMORY,
    SLOWDOWN_DIAGNOSIS,
    STEP_BASELINE_RESET,
    STEP_SLOWDOWN,
    STEP_SPEED_RECOVERED,
    STRAGGLER,
    SYNC_AUDIT,
    SYNC_POINT,
)
from profcallbacks.report.analyse.fmt import steps

WIDTH, HEIGHT = 900, 300
LEFT, RIGHT, TOP, BOTTOM = 60, 20, 20, 40
RANK_COLOURS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#7f7f7f", "#bcbd22", "#e377c2")
FINDING_COLOURS = {DATALOADER_STALL: "#ff7f0e", STEP_SLOWDOWN: "#d62728", STRAGGLER: "#e377c2",
                   CAPTURE_VERDICT: "#6a1b9a", SYNC_POINT: "#00897b", SLOWDOWN_DIAGNOSIS: "#ad1457",
                   MEMORY_CREEP: "#283593", MEMORY_SITES: "#5c6bc0", OUT_OF_MEMORY: "#000000",
                   DATALOADER_STALL_CLEARED: "#ffcc80", DATALOADER_WAIT: "#e65100",
                   STEP_SPEED_RECOVERED: "#ef9a9a", STEP_BASELINE_RESET: "#8d6e63",
                   SYNC_AUDIT: "#90a4ae"}
OTHER_COLOURS = ("#555555", "#9e9d24", "#0277bd", "#4e342e", "#00bcd4", "#c0ca33")


def finding_colours(kinds: set[str]) -> dict[str, str]:
    """A colour for each kind: its own for known kinds, distinct ones for the others.

    Example:
        >>> finding_colours({"sync_point", "capture_verdict", "mine"})["mine"]
        '#555555'
    """
    colours = {k: FINDING_COLOURS[k] for k in kinds if k in FINDING_COLOURS}
    others = sorted(k for k in kinds if k not in FINDING_COLOURS)
    colours.update((k, OTHER_COLOURS[n % len(OTHER_COLOURS)]) for n, k in enumerate(others))
    return colours


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    for step in (1, 2, 2.5, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10000, 1e5, 1e6):
        if value <= step:
            return float(step)
    return value


_CLEARED_BY = {DATALOADER_STALL: DATALOADER_STALL_CLEARED, STEP_SLOWDOWN: STEP_SPEED_RECOVERED}


def _open_episodes(findings: list[dict[str, Any]]) -> set[int]:
    """``id()`` of each rank's last stall/slowdown finding that no later finding cleared."""
    last: dict[tuple[str, Any], dict[str, Any]] = {}
    for f in sorted(findings, key=lambda f: f["step"] if isinstance(f["step"], int) else -1):
        kind = str(f["kind"])
        if kind in _CLEARED_BY:
            last[(kind, f["rank"])] = f
        for opened, cleared in _CLEARED_BY.items():
            if kind == cleared:
                last.pop((opened, f["rank"]), None)
    return {id(f) for f in last.values()}


def step_time_svg(report: dict[str, Any]) -> str:
    """An SVG plot of interval mean step time per rank, traced steps, captures and findings."""
    intervals = (report["steps"] or {}).get("intervals", [])
    per_step = (report["breakdown"] or {}).get("per_step", [])
    findings = report["findings"]
    captures = [c for c in report["captures"] if c["steps"]]
    xs = ([r["first_step"] for r in intervals] + [r["last_step"] + 1 for r in intervals]
          + [s["step"] for s in per_step] + [f["step"] for f in findings if isinstance(f["step"], int)]
          + [s + 1 for c in captures for s in c["steps"]])
    ys = [r["step_time_ms"] for r in intervals] + [s["step_ms"] for s in per_step]
    if not xs or not ys:
        return '<p class="empty">No step times to plot.</p>'
    x0, x1 = min(xs), max(max(xs), min(xs) + 1)
    y1 = _nice_max(max(ys) * 1.1)
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(step: float) -> float:
        return LEFT + (step - x0) / (x1 - x0) * pw

    def sy(ms: float) -> float:
        return TOP + ph - min(ms, y1) / y1 * ph

    parts = [f'<svg id="step-time-plot" viewBox="0 0 {WIDTH} {HEIGHT}"'
             f' width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="Step time over the run">']
    for c in captures:  # capture windows as shaded bands
        a, b = sx(c["steps"][0]), sx(c["steps"][-1] + 1)
        label = escape(f"capture {c['directory']}: {steps(c['steps'][0], c['steps'][-1])}")
        parts.append(f'<rect class="capture-window" x="{a:.1f}" y="{TOP}" width="{max(b - a, 2):.1f}" '
                     f'height="{ph}" fill="#fdd835" fill-opacity="0.25"><title>{label}</title></rect>')
    for i in range(5):  # y grid and labels
        ms = y1 * i / 4
        y = sy(ms)
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">{ms:g}</text>')
    for i in range(6):  # x labels
        step = x0 + (x1 - x0) * i / 5
        parts.append(f'<text x="{sx(step):.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle" '
                     f'class="tick">{step:.0f}</text>')
    parts.append(f'<text x="{LEFT + pw / 2}" y="{HEIGHT - 6}" text-anchor="middle" class="axis">step</text>')
    parts.append(f'<text x="14" y="{TOP + ph / 2}" text-anchor="middle" class="axis" '
                 f'transform="rotate(-90 14 {TOP + ph / 2})">step time (ms)</text>')
    run_last = int(x1) - 1
    still_open = _open_episodes(findings)
    colours = finding_colours({str(f["kind"]) for f in findings})
    for f in findings:  # stalls, slowdowns and other findings as vertical markers
        if not isinstance(f["step"], int):
            continue
        colour = colours[str(f["kind"])]
        x = sx(f["step"])
        tip = escape(f"{f['kind']} at step {f['step']} (rank {f['rank']}): {f['message']}")
        first, last = f["details"].get("first_step"), f["details"].get("last_step")
        if isinstance(first, int) and isinstance(last, int) and last >= first:  # the episode
            a, b = sx(first), sx(last + 1)
            parts.append(f'<rect class="finding-span" data-kind="{escape(str(f["kind"]))}" '
                         f'x="{a:.1f}" y="{TOP}" width="{max(b - a, 2):.1f}" height="6" '
                         f'fill="{colour}" fill-opacity="0.7"><title>{tip}</title></rect>')
            if id(f) in still_open and run_last > last:  # never cleared: a thin line on
                parts.append(f'<line class="finding-open" data-kind="{escape(str(f["kind"]))}" '
                             f'x1="{b:.1f}" x2="{sx(run_last + 1):.1f}" y1="{TOP + 9}" '
                             f'y2="{TOP + 9}" stroke="{colour}" stroke-width="1" '
                             f'stroke-dasharray="2 4"><title>not cleared by the end of the '
                             f'run: {tip}</title></line>')
        parts.append(f'<line class="finding-marker" data-kind="{escape(str(f["kind"]))}" x1="{x:.1f}" '
                     f'x2="{x:.1f}" y1="{TOP}" y2="{TOP + ph}" stroke="{colour}" stroke-width="2" '
                     f'stroke-dasharray="4 3"><title>{tip}</title></line>')
    ranks = sorted({r["rank"] for r in intervals})
    for n, rank in enumerate(ranks):  # interval means per rank
        colour = RANK_COLOURS[n % len(RANK_COLOURS)]
        pts = []
        for r in (r for r in intervals if r["rank"] == rank):
            y = sy(r["step_time_ms"])
            pts += [f"{sx(r['first_step']):.1f},{y:.1f}", f"{sx(r['last_step'] + 1):.1f},{y:.1f}"]
        parts.append(f'<polyline class="series" data-rank="{rank}" points="{" ".join(pts)}" fill="none" '
                     f'stroke="{colour}" stroke-width="2"><title>rank {rank}: mean step time per '
                     f'interval</title></polyline>')
    for s in per_step:  # traced steps, exact
        tip = escape(f"step {s['step']} rank {s['rank']}: {s['step_ms']:.2f} ms "
                     f"(data wait {s['data_wait_ms']:.2f} ms)")
        parts.append(f'<circle class="traced-step" cx="{sx(s["step"] + 0.5):.1f}" '
                     f'cy="{sy(s["step_ms"]):.1f}" r="3" fill="#000"><title>{tip}</title></circle>')
    parts.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
    parts.append("</svg>")
    legend = ['<div class="legend">']
    legend += [f'<span><i style="background:{RANK_COLOURS[n % len(RANK_COLOURS)]}"></i>rank {r} '
               f'mean per interval</span>' for n, r in enumerate(ranks)]
    legend.append('<span><i style="background:#000;border-radius:50%"></i>traced step</span>')
    legend.append('<span><i style="background:#fdd835;opacity:.5"></i>capture window</span>')
    for kind in sorted({str(f["kind"]) for f in findings}):
        legend.append(f'<span><i style="background:{colours[kind]}"></i>'
                      f'{escape(kind)}</span>')
    legend.append("</div>")
    return "\n".join(parts + legend)
