"""The report's torch.compile section: compile time, recompiles, fallbacks to eager, graph breaks.

Read from the steps files' ``compile_ms`` and the ``recompile``/``compile_fallback``/
``graph_break`` findings; ``None`` for a run in which nothing compiled.
"""

from __future__ import annotations

import textwrap
from typing import Any

from profcallbacks.core.trace_names import COMPILED_PREFIXES
from profcallbacks.findings import COMPILE_FALLBACK, GRAPH_BREAK, RECOMPILE
from profcallbacks.report.read.files import as_int

__all__ = ["COMPILED_PREFIXES", "COMPILE_KINDS", "compile_diagnoses", "compile_report", "compile_text"]
COMPILE_KINDS = (RECOMPILE, COMPILE_FALLBACK, GRAPH_BREAK)

RECOMPILE_ADVICE = ("Give the compiled function inputs whose shapes it has seen: mark the "
                    "changing dimension dynamic (torch._dynamo.mark_dynamic(x, dim) or "
                    "torch.compile(dynamic=True)), or pad/bucket lengths to a few sizes; a guard on "
                    "a Python value (a float, a flag) becomes a recompile per value: pass it as a "
                    "tensor.")
FALLBACK_ADVICE = ("The function runs eagerly for new inputs: fix the recompiles (dynamic=True, "
                   "mark_dynamic, padding or bucketing shapes), or raise "
                   "torch._dynamo.config.recompile_limit if the shapes are few.")
GRAPH_BREAK_ADVICE = ("Keep forward free of what dynamo cannot trace at the named lines: log "
                      ".item()/print outside the compiled function (every N steps), or set "
                      "torch._dynamo.config.capture_scalar_outputs = True for .item().")


def compile_report(rows: list[dict[str, Any]], findings: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Compile time per rank and in all, with what recompiled, fell back and broke the graph."""
    per_rank: dict[int, float] = {}
    summaries = 0
    for row in rows:
        value = row.get("compile_ms")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            rank = as_int(row.get("rank"))
            per_rank[rank] = per_rank.get(rank, 0.0) + float(value) / 1e3
            summaries += 1
    recompiles = [f for f in findings if f["kind"] == RECOMPILE]
    fallbacks = [f for f in findings if f["kind"] == COMPILE_FALLBACK]
    breaks = [f for f in findings if f["kind"] == GRAPH_BREAK]
    if not (per_rank or recompiles or fallbacks or breaks):
        return None
    functions: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
    for f in recompiles:
        d = f["details"]
        key = (d.get("function"), d.get("file"), d.get("line"))
        entry = functions.setdefault(key, {"function": key[0], "file": key[1], "line": key[2],
                                           "recompiles": 0, "compile_s": 0.0, "steps": []})
        entry["recompiles"] += 1
        entry["compile_s"] += _number(d.get("compile_s"))
        entry["steps"].append(as_int(f["step"]))
        entry["last_change"] = _change(d)
    return {
        "compile_s": round(sum(per_rank.values()), 3),
        "compile_s_per_rank": [{"rank": r, "compile_s": round(s, 3)}
                               for r, s in sorted(per_rank.items())],
        "summaries_with_compiles": summaries,
        "recompiles": len(recompiles),
        "recompile_s": round(sum(_number(f["details"].get("compile_s")) for f in recompiles), 3),
        "recompiled_functions": sorted(functions.values(), key=lambda e: -e["recompiles"]),
        "fallbacks": [{"function": f["details"].get("function"), "file": f["details"].get("file"),
                       "line": f["details"].get("line"), "step": as_int(f["step"]),
                       "rank": as_int(f["rank"]), "limit": f["details"].get("limit")}
                      for f in fallbacks],
        "graph_breaks": [{"file": f["details"].get("file"), "line": f["details"].get("line"),
                          "reason": f["details"].get("reason"), "step": as_int(f["step"]),
                          "rank": as_int(f["rank"])} for f in breaks],
    }


def compile_diagnoses(block: dict[str, Any] | None,
                      steps: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The compile events as run diagnoses (``recompiles``, ``compile_fallback``,
    ``graph_breaks``), in the form of the trace rules' (report/diagnoses): the recompiles' gain is
    their compile time spread over the run's steps; a fallback's and a graph break's cost is not
    in the steps files (0: ranked last, said all the same)."""
    if block is None:
        return []
    total = as_int(steps.get("steps")) if steps else 0  # every step of the run, excluded too
    mean_ms = _number(steps.get("mean_ms")) if steps else 0.0
    out: list[dict[str, Any]] = []
    if block["recompiles"]:
        gain = block["recompile_s"] * 1e3 / total if total else 0.0
        top = block["recompiled_functions"][0]
        out.append(_diagnosis(
            "recompiles", f"{block['recompiles']} recompiles cost {block['recompile_s']:.1f} s",
            [f"{e['function']}() {_where(e)}: {e['recompiles']}x, {e['compile_s']:.1f} s"
             + (f", last because {e['last_change']}" if e.get("last_change") else "")
             for e in block["recompiled_functions"][:3]],
            f"{top['function']}() {_where(top)}", gain, gain / mean_ms if mean_ms else 0.0,
            RECOMPILE_ADVICE))
    if block["fallbacks"]:
        fb = block["fallbacks"][0]
        out.append(_diagnosis(
            "compile_fallback", f"{fb['function']}() runs eagerly for new inputs from step "
            f"{fb['step']} on ({fb['limit']} reached)",
            [f"{f['function']}() {_where(f)} at step {f['step']} (rank {f['rank']})"
             for f in block["fallbacks"][:3]], f"{fb['function']}() {_where(fb)}", 0.0, 0.0,
            FALLBACK_ADVICE))
    sites = list({(b["file"], b["line"]): b for b in block["graph_breaks"]}.values())
    if sites:
        out.append(_diagnosis(
            "graph_breaks", f"{len(sites)} graph break{'s' if len(sites) != 1 else ''} per step "
            "split the compiled graph", [f"{_where(b)}: {b['reason']}" for b in sites[:3]],
            _where(sites[0]), 0.0, 0.0, GRAPH_BREAK_ADVICE))
    return out


def _diagnosis(kind: str, what: str, evidence: list[str], where: str, gain_ms: float,
               gain_share: float, fix: str) -> dict[str, Any]:
    return {"kind": kind, "what": what, "evidence": evidence, "where": where,
            "gain_ms": round(gain_ms, 4), "gain_share": round(gain_share, 4), "fix": [fix],
            "details": {"source": "compile events"}, "seen_in": ["findings"]}


def compile_text(block: dict[str, Any] | None) -> list[str]:
    """The section as text lines (nothing for a run in which nothing compiled)."""
    if block is None:
        return []
    ranks = ", ".join(f"rank {r['rank']} {r['compile_s']:.1f} s" for r in block["compile_s_per_rank"])
    out = ["torch.compile",
           f"  compile time {block['compile_s']:.1f} s in all" + (f" ({ranks})" if ranks else "")
           + "; steps that compiled are left out of the step statistics"]
    if block["recompiles"]:
        out.append(f"  recompiles: {block['recompiles']} ({block['recompile_s']:.1f} s)")
        for entry in block["recompiled_functions"][:5]:
            change = f", last because {entry['last_change']}" if entry.get("last_change") else ""
            out.append(f"    {entry['function']}() {_where(entry)}: {entry['recompiles']}x, "
                       f"{entry['compile_s']:.1f} s, steps {_steps(entry['steps'])}{change}")
        out += _wrap("    try: ", RECOMPILE_ADVICE)
    for fb in block["fallbacks"]:
        out.append(f"  fell back to eager: {fb['function']}() {_where(fb)} at step {fb['step']} "
                   f"(rank {fb['rank']}): {fb['limit']} reached")
    if block["fallbacks"]:
        out += _wrap("    try: ", FALLBACK_ADVICE)
    sites = {(b["file"], b["line"]): b for b in block["graph_breaks"]}
    if sites:
        out.append(f"  graph breaks: {len(sites)} per step")
        for b in list(sites.values())[:5]:
            out.append(f"    {_where(b)}: {b['reason']}")
        out += _wrap("    try: ", GRAPH_BREAK_ADVICE)
    return out + [""]


def _wrap(prefix: str, text: str) -> list[str]:
    return textwrap.wrap(text, 100, initial_indent=prefix, subsequent_indent=" " * len(prefix))


def _where(entry: dict[str, Any]) -> str:
    file = str(entry.get("file") or "?").replace("\\", "/").split("/")
    return f"{'/'.join(file[-2:])}:{entry.get('line')}"


def _steps(steps: list[int]) -> str:
    shown = ", ".join(str(s) for s in steps[:6])
    return shown + (f" ... ({len(steps)})" if len(steps) > 6 else "")


def _change(details: dict[str, Any]) -> str | None:
    if details.get("changed") is not None:
        return f"{details['changed']} changed {details.get('old')} -> {details.get('new')}"
    guard = details.get("guard")
    return str(guard) if guard else None


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0
