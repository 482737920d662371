"""The report's memory section: memory over the run, creep alerts, the lines that keep memory.

Read from the memory fields of the steps files (``memory_allocated_mb``, ``memory_reserved_mb``,
``memory_peak_mb``, ``process_rss_mb``) and the ``memory_*``/``out_of_memory`` findings.
"""

from __future__ import annotations

from html import escape
from typing import Any

from profcallbacks.findings import MEMORY_CREEP, MEMORY_SITES, OUT_OF_MEMORY

FIELDS = ("memory_allocated_mb", "memory_reserved_mb", "memory_peak_mb", "process_rss_mb")
MAX_SAMPLES = 200  # per rank in the report; evenly thinned beyond that
WIDTH, HEIGHT, PAD = 900, 220, 50


def memory_report(rows: list[dict[str, Any]], findings: list[dict[str, Any]]) -> dict[str, Any] | None:
    """``report["memory"]``: ``None`` when the run has no memory numbers and no memory findings.

    Keys: ``source`` (``"cuda_allocated"`` or ``"process_rss"``), ``samples`` (``{"rank",
    "step", <fields>}``, at most 200 per rank), ``per_rank`` (first, last and peak MB of the
    source), ``creep``, ``sites`` (largest first, over ranks) and ``out_of_memory`` findings.
    """
    samples = sorted(({"rank": r["rank"], "step": r["last_step"],
                       **{k: r[k] for k in FIELDS if isinstance(r.get(k), (int, float))}}
                      for r in rows if isinstance(r.get("rank"), int)
                      and isinstance(r.get("last_step"), int) and any(k in r for k in FIELDS)),
                     key=lambda s: (s["step"], s["rank"]))
    mine = [f for f in findings if f["kind"] in (MEMORY_CREEP, MEMORY_SITES, OUT_OF_MEMORY)]
    if not samples and not mine:
        return None
    source = "cuda_allocated" if any("memory_allocated_mb" in s for s in samples) else "process_rss"
    key = "memory_allocated_mb" if source == "cuda_allocated" else "process_rss_mb"
    per_rank, kept = [], []
    for rank in sorted({s["rank"] for s in samples}):
        series = [s for s in samples if s["rank"] == rank and key in s]
        if series:
            per_rank.append({"rank": rank, "first_mb": series[0][key], "last_mb": series[-1][key],
                             "peak_mb": max(s.get("memory_peak_mb", s[key]) for s in series)})
        kept += _thin([s for s in samples if s["rank"] == rank], MAX_SAMPLES)
    sites = [dict(site, rank=f["rank"], step=f["step"]) for f in mine if f["kind"] == MEMORY_SITES
             for site in f["details"].get("sites", []) if isinstance(site, dict)]
    return {"source": source, "samples": sorted(kept, key=lambda s: (s["step"], s["rank"])),
            "per_rank": per_rank,
            "creep": [_brief(f) for f in mine if f["kind"] == MEMORY_CREEP],
            "sites": sorted(sites, key=lambda s: -s.get("bytes", 0)),
            "out_of_memory": [_brief(f) for f in mine if f["kind"] == OUT_OF_MEMORY]}


def _brief(finding: dict[str, Any]) -> dict[str, Any]:
    return {"rank": finding["rank"], "step": finding["step"], "message": finding["message"],
            **{k: v for k, v in finding["details"].items() if not isinstance(v, (list, dict))}}


def _thin(items: list[dict[str, Any]], most: int) -> list[dict[str, Any]]:
    if len(items) <= most:
        return items
    stride = (len(items) - 1) / (most - 1)
    return [items[round(i * stride)] for i in range(most)]


def memory_text(memory: dict[str, Any] | None) -> list[str]:
    """The memory section of the text report (empty without memory numbers)."""
    if memory is None:
        return []
    out = [f"Memory ({memory['source']}, MB, from profcallbacks/rank*.steps.jsonl)"]
    out += [f"  rank {r['rank']}: {r['first_mb']:,.0f} at start, {r['last_mb']:,.0f} at the end, "
            f"peak {r['peak_mb']:,.0f}" for r in memory["per_rank"]]
    out += [f"  memory_creep (rank {c['rank']}, step {c['step']}): {c['message']}"
            for c in memory["creep"]]
    if memory["sites"]:
        out.append("  kept by (allocations of the memory capture still alive later):")
        out += [f"    {s['location']}  {s['bytes'] / 2**20:,.2f} MB in {s['count']} tensors "
                f"(rank {s['rank']})" for s in memory["sites"][:10]]
    out += [f"  out_of_memory (rank {o['rank']}, step {o['step']}): {o['message']}"
            for o in memory["out_of_memory"]]
    return out + [""]


def memory_html(memory: dict[str, Any] | None) -> str:
    """The memory section of the HTML report: a plot of the source per rank, alerts and sites."""
    if memory is None:
        return ""
    parts = [f"<h2>Memory</h2><p>{escape(memory['source'])}, MB per step summary.</p>",
             _svg(memory)]
    parts += [f"<p class=sev-warning>memory_creep (rank {c['rank']}, step {c['step']}): "
              f"{escape(c['message'])}</p>" for c in memory["creep"]]
    parts += [f"<p class=sev-error>out_of_memory (rank {o['rank']}, step {o['step']}): "
              f"{escape(o['message'])}</p>" for o in memory["out_of_memory"]]
    if memory["sites"]:
        rows = "".join(f"<tr><td><code>{escape(str(s['location']))}</code></td><td class=num>"
                       f"{s['bytes'] / 2**20:,.2f}</td><td class=num>{s['count']}</td><td "
                       f"class=num>{s['rank']}</td></tr>" for s in memory["sites"][:20])
        parts.append("<table id=memory-sites><thead><tr><th>kept by</th><th>MB</th><th>tensors"
                     f"</th><th>rank</th></tr></thead><tbody>{rows}</tbody></table>")
    return "\n".join(parts)


def _svg(memory: dict[str, Any]) -> str:
    key = "memory_allocated_mb" if memory["source"] == "cuda_allocated" else "process_rss_mb"
    points = [s for s in memory["samples"] if key in s]
    if len(points) < 2:
        return '<p class="empty">Too few memory samples to plot.</p>'
    x0, x1 = min(p["step"] for p in points), max(p["step"] for p in points)
    y1 = max(p[key] for p in points) * 1.1 or 1.0
    x1 = max(x1, x0 + 1)

    def xy(p: dict[str, Any]) -> str:
        x = PAD + (p["step"] - x0) / (x1 - x0) * (WIDTH - 2 * PAD)
        return f"{x:.1f},{HEIGHT - PAD - p[key] / y1 * (HEIGHT - 2 * PAD):.1f}"

    lines = "".join(f'<polyline fill=none stroke="#1f77b4" stroke-width=1.5 points="'
                    f'{" ".join(xy(p) for p in points if p["rank"] == rank)}"/>'
                    for rank in sorted({p["rank"] for p in points}))
    labels = (f'<text class=tick x={PAD} y={HEIGHT - PAD + 16}>step {x0}</text>'
              f'<text class=tick x={WIDTH - PAD} y={HEIGHT - PAD + 16} text-anchor=end>step {x1}'
              f'</text><text class=tick x=4 y={PAD}>{y1:,.0f} MB</text>'
              f'<text class=tick x=4 y={HEIGHT - PAD}>0</text>')
    return (f'<svg id=memory-plot width={WIDTH} height={HEIGHT} viewBox="0 0 {WIDTH} {HEIGHT}" '
            f'role=img>{lines}{labels}</svg>')
