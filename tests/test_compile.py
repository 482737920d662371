"""torch.compile's events as findings, with real dynamo and inductor (no mocks)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch._dynamo

import helpers
from compile_models import LoggingInForward, Printing, Shaped, def_line, line_of
from front_ends import FRONT_ENDS
from profcallbacks import StepProfiler
from profcallbacks.findings import COMPILE_FALLBACK, GRAPH_BREAK, RECOMPILE, Finding
from profcallbacks.layout import steps_file

QUIET = {**helpers.QUIET, "memory": None, "log_every_n_steps": 1}


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=3):
        yield
    torch._dynamo.reset()


def call_line() -> int:
    return next(k for k, line in enumerate(Path(__file__).read_text().splitlines(), 1)
                if line.strip().endswith("# the call"))


def train(prof: StepProfiler, model: torch.nn.Module, lengths: list[int]) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with prof:
        for length in prof.wrap(lengths):
            x = torch.randn(2, length, 8)
            loss = model(x).pow(2).mean()  # the call
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            prof.step()


def kinds(findings: list[Finding], kind: str) -> list[Finding]:
    return [f for f in findings if f.kind == kind]


def rows(logdir: Path) -> list[dict]:
    return [json.loads(line) for line in steps_file(logdir, 0).read_text().splitlines()]


@pytest.mark.slow  # the first inductor compile of a process takes ~15 s here
def test_new_lengths_recompile_then_fall_back_to_eager(tmp_path: Path) -> None:
    """Static shapes, a new length every 3 steps: recompiles with the guard, then the limit."""
    model = torch.compile(Shaped(), dynamic=False)
    prof = StepProfiler(tmp_path, **QUIET)
    lengths = [4 + k // 3 for k in range(15)]  # 4,4,4,5,5,5,6,6,6,7,7,7,8,8,8
    train(prof, model, lengths)

    recompiles = kinds(prof.findings, RECOMPILE)
    assert [f.step for f in recompiles] == [3, 6]
    first = recompiles[0]
    assert first.severity == "warning"
    assert first.details["changed"] == "x.size(1)"
    assert (first.details["old"], first.details["new"]) == ("4", "5")
    assert "size mismatch at index 1" in first.details["guard"]
    assert first.details["file"].endswith("compile_models.py")
    assert first.details["line"] == def_line(Shaped)
    assert first.details["call_file"] == __file__
    assert first.details["call_line"] == call_line()
    assert [f.details["recompiles"] for f in recompiles] == [1, 2]
    assert first.details["compile_s"] > 0
    assert "step 3 recompiled Shaped.forward() (tests/compile_models.py" in first.message
    assert "because x.size(1) changed 4 -> 5" in first.message

    fallbacks = kinds(prof.findings, COMPILE_FALLBACK)
    assert len(fallbacks) == 1 and fallbacks[0].step == 9
    fallback = fallbacks[0]
    assert fallback.severity == "warning"
    assert fallback.details["limit"] == "recompile_limit" and fallback.details["limit_value"] == 3
    assert fallback.details["function"] == "forward"
    assert fallback.details["line"] == def_line(Shaped)
    assert "mark_dynamic" in fallback.message and "dynamic=True" in fallback.message
    assert "x.size(1) changed 6 -> 7" in fallback.message
    assert not kinds(prof.findings, GRAPH_BREAK)

    # the steps that compiled are not the job's speed: out of the statistics, with compile_ms
    by_step = {row["first_step"]: row for row in rows(tmp_path)}
    compiled = sorted(step for step, row in by_step.items() if row.get("compile_ms"))
    assert compiled == [0, 3, 6]
    assert all(by_step[step]["steps_excluded"] == 1 and by_step[step]["counted_us"] == []
               for step in compiled)
    assert all(row["steps_excluded"] == 0 for step, row in by_step.items() if step not in compiled)
    total_ms = sum(row.get("compile_ms", 0.0) for row in by_step.values())
    assert total_ms == pytest.approx(prof.session.compile_s * 1e3, rel=0.01)
    # dynamo's own duration of the recompile (forward and backward) and the step's compile time
    # measured between the compile callbacks are the same compile, timed at slightly other points
    assert by_step[3]["compile_ms"] == pytest.approx(first.details["compile_s"] * 1e3, rel=0.2)


def test_a_print_in_forward_is_a_graph_break_at_its_line(tmp_path: Path) -> None:
    model = torch.compile(Printing(), backend="aot_eager")
    prof = StepProfiler(tmp_path, **QUIET)
    train(prof, model, [4] * 4)
    breaks = kinds(prof.findings, GRAPH_BREAK)
    assert breaks, [f.message for f in prof.findings]
    assert {(f.details["file"], f.details["line"]) for f in breaks} == {
        (str(Path(__file__).with_name("compile_models.py")), line_of(Printing, "print("))}
    assert breaks[0].severity == "info" and breaks[0].step == 0
    assert "item()" in breaks[0].details["reason"] or "print" in breaks[0].details["reason"]
    assert "compile_models.py:" in breaks[0].message


def test_a_graph_break_inside_a_library_names_the_users_calling_line(tmp_path: Path) -> None:
    model = torch.compile(LoggingInForward(), backend="aot_eager")
    prof = StepProfiler(tmp_path, **QUIET)
    train(prof, model, [4] * 4)
    [found] = kinds(prof.findings, GRAPH_BREAK)
    user_file = str(Path(__file__).with_name("compile_models.py"))
    call_line = line_of(LoggingInForward, "rank_zero_info(")
    assert (found.details["call_file"], found.details["call_line"]) == (user_file, call_line)
    assert "lightning_utilities" in found.details["file"] and found.details["line"]
    assert f"graph break at tests/compile_models.py:{call_line} (inside lightning_utilities" in (
        found.message)
    assert "logging" in found.details["reason"]


def test_a_steady_compiled_loop_has_no_compile_findings(tmp_path: Path) -> None:
    model = torch.compile(Shaped(), backend="aot_eager", dynamic=False)
    prof = StepProfiler(tmp_path, **QUIET)
    train(prof, model, [6] * 12)
    assert [f for f in prof.findings if f.kind in (RECOMPILE, COMPILE_FALLBACK, GRAPH_BREAK)] == []
    compiled = [row["first_step"] for row in rows(tmp_path) if row.get("compile_ms")]
    assert compiled == [0]  # the first compile is in step 0, and nothing after it


class Lengths(torch.utils.data.Dataset):
    """The ``k``-th sample fetched is ``4 + k // 6`` long (whatever the sampler's order): with
    batches of 2, a new length every 3 steps."""

    def __init__(self) -> None:
        self.fetched = 0

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        self.fetched += 1
        return {"x": torch.randn(4 + (self.fetched - 1) // 6, 8)}


class CompiledShaped(torch.nn.Module):
    """The front ends' model: ``loss(x)`` calls a compiled :class:`Shaped` (static shapes)."""

    def __init__(self) -> None:
        super().__init__()
        self.compiled = torch.compile(Shaped(), backend="aot_eager", dynamic=False)

    def loss(self, x: torch.Tensor) -> torch.Tensor:
        return self.compiled(x).pow(2).mean()  # the front-end call


@pytest.mark.parametrize("front_end", sorted(FRONT_ENDS))
def test_every_front_end_reports_recompiles_and_the_fallback(tmp_path: Path,
                                                             front_end: str) -> None:
    options = {key: value for key, value in QUIET.items() if key != "log_every_n_steps"}
    findings = FRONT_ENDS[front_end](tmp_path, Lengths(), 15, options, model=CompiledShaped)
    recompiles = kinds(findings, RECOMPILE)
    assert [f.step for f in recompiles] == [3, 6]
    assert [(f.details["old"], f.details["new"]) for f in recompiles] == [("4", "5"), ("5", "6")]
    assert all(f.details["line"] == def_line(Shaped) for f in recompiles)
    line = next(k for k, text in enumerate(Path(__file__).read_text().splitlines(), 1)
                if text.strip().endswith("# the front-end call"))
    assert {(f.details["call_file"], f.details["call_line"]) for f in recompiles} == {
        (__file__, line)}
    assert [f.step for f in kinds(findings, COMPILE_FALLBACK)] == [9]
    excluded = sum(row["steps_excluded"] for row in rows(tmp_path))
    assert excluded == 3  # steps 0, 3 and 6 compiled


def test_a_slowdown_that_begins_with_a_recompile_names_it(tmp_path: Path) -> None:
    """Longer inputs from a step past 40: the step recompiles and every step after it is slower.

    At any machine speed: the longer inputs' cost is sized on the step time measured before them
    (8x, well past the 2x threshold), they begin once no slowdown of the machine's own is going
    on, and the run ends once the slowdown after them is alerted (a time limit only as a guard).
    """
    import time
    from statistics import median

    from profcallbacks import SlowdownConfig
    from profcallbacks.findings import STEP_BASELINE_RESET, STEP_SLOWDOWN, STEP_SPEED_RECOVERED

    model = torch.compile(Shaped(), backend="aot_eager", dynamic=False)
    slowdown = SlowdownConfig(threshold=2.0, warmup_steps=5, baseline_steps=10, baseline_block_s=0.0,
                              baseline_blocks=2, min_steps=10, min_duration_s=0.05)
    seen: list[Finding] = []
    prof = StepProfiler(tmp_path, **{**QUIET, "slowdown": slowdown, "capture_on_slowdown": False},
                        on_finding=seen.append)
    states = (STEP_SLOWDOWN, STEP_SPEED_RECOVERED, STEP_BASELINE_RESET)
    ends: list[float] = []
    switch: int | None = None
    cost_s = 0.002
    deadline = time.monotonic() + 300
    with prof:
        step = 0
        while not any(f.kind == STEP_SLOWDOWN and f.step >= (switch or 10**9) for f in seen):
            assert time.monotonic() < deadline, [f.message for f in seen]
            length = 4 if switch is None else 64
            model(torch.randn(2, length, 8)).sum().backward()
            time.sleep(cost_s)  # the inputs' real cost
            prof.step()
            ends.append(time.perf_counter())
            step += 1
            alerted = [f.kind for f in seen if f.kind in states][-1:] == [STEP_SLOWDOWN]
            if switch is None and step >= 40 and not alerted:
                switch = step  # the longer inputs from here on
                cost_s = 8 * median(b - a for a, b in zip(ends[-11:], ends[-10:], strict=False))
    assert switch is not None
    early = [f for f in kinds(prof.findings, STEP_SLOWDOWN) if f.step < switch]  # a loaded machine
    assert not any("torch.compile" in f.message for f in early)
    slow = [f for f in kinds(prof.findings, STEP_SLOWDOWN) if f.step >= switch]
    assert len(slow) == 1, [f.message for f in prof.findings]
    assert f"step {switch} recompiled Shaped.forward()" in slow[0].message
    assert "because x.size(1) changed 4 -> 64" in slow[0].message
    assert [e["step"] for e in slow[0].details["compile_events"]] == [switch]
    compiling = [row for row in rows(tmp_path) if row.get("compile_ms")]
    assert [(row["first_step"], row["steps_excluded"]) for row in compiling] == [(0, 1), (switch, 1)]


def test_the_report_and_compare_show_compile_events(tmp_path: Path) -> None:
    from profcallbacks import Schedule
    from profcallbacks.report import build_report, compare_reports, render_compare_text, render_text
    from profcallbacks.report.build import locate_run
    from profcallbacks.report.render.html import render_html

    model = torch.compile(Shaped(), backend="aot_eager", dynamic=False)
    compiled = tmp_path / "compiled"
    prof = StepProfiler(compiled, **{**QUIET, "log_every_n_steps": 5,
                                     "schedule": Schedule(skip_first=8, warmup=1, active=2)})
    train(prof, model, [4] * 12 + [5] * 3 + [6] * 3 + [7] * 3)
    report = build_report(locate_run(compiled))
    block = report["compile"]
    assert block["recompiles"] == 2 and [f["step"] for f in block["fallbacks"]] == [18]
    assert block["compile_s"] == pytest.approx(prof.session.compile_s, rel=0.01)
    assert block["recompiled_functions"][0]["steps"] == [12, 15]
    assert report["steps"]["steps_excluded"] == 3 + 3  # three compiling steps, three traced ones
    assert report["breakdown"]["compiled_ms"] > 0  # the traced steps ran compiled regions
    text = render_text(report)
    assert "torch.compile\n  compile time" in text
    assert "forward() tests/compile_models.py:" in text and "x.size(1) changed 5 -> 6" in text
    assert "fell back to eager: forward()" in text and "torch.compile code" in text
    assert report["run_context"]["compiled"] is True
    diagnosed = {d["kind"]: d for d in report["diagnoses"]}
    assert {"recompiles", "compile_fallback"} <= set(diagnosed)
    assert diagnosed["recompiles"]["gain_ms"] == pytest.approx(
        block["recompile_s"] * 1e3 / 21, rel=0.01)  # spread over the run's 21 steps
    assert "x.size(1) changed 5 -> 6" in diagnosed["recompiles"]["evidence"][0]
    assert "recompiles: ~" in text  # its gain per step, as every diagnosis gives it
    assert "try torch.compile" not in text and "Fuse kernels (torch.compile)" not in text
    page = render_html(report)
    section = page[page.index("<h2 id=compile>torch.compile</h2>"):]
    assert "recompiles: 2" in section and "x.size(1) changed 5 -&gt; 6" in section
    assert "fell back to eager: forward()" in section

    from rich.console import Console

    from profcallbacks.watch.state import LogdirState
    from profcallbacks.watch.view import render

    state = LogdirState(compiled)
    state.poll()
    console = Console(width=200, record=True)
    console.print(render(state))
    frame = console.export_text()
    assert f"compiling {prof.session.compile_s:.1f} s" in frame
    assert "compile_fallback" in frame and "recompile" in frame

    torch._dynamo.reset()
    eager = tmp_path / "eager"
    train(StepProfiler(eager, **QUIET), Shaped(), [4] * 12)
    plain = build_report(locate_run(eager))
    assert plain["compile"] is None and "torch.compile\n" not in render_text(plain)
    assert "id=compile" not in render_html(plain)
    cmp = compare_reports(plain, report)
    assert cmp["compile"]["recompiles"] == {"a": 0, "b": 2}
    assert "recompiles 0 -> 2, fallbacks to eager 0 -> 1" in render_compare_text(cmp)


def test_evaluation_between_steps_recompiles_as_info_and_excludes_no_step(tmp_path: Path) -> None:
    model = torch.compile(Shaped(), backend="aot_eager", dynamic=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    prof = StepProfiler(tmp_path, **QUIET)
    with prof:
        for step in range(6):
            model(torch.randn(2, 4, 8)).sum().backward()
            optimizer.step()
            prof.step()
            if step == 2:
                prof.pause("validation")
                model.eval()
                with torch.no_grad():
                    model(torch.randn(2, 4, 8))
                model.train()
                prof.resume()
    recompiles = kinds(prof.findings, RECOMPILE)
    assert recompiles and all(f.severity == "info" and f.details["between_steps"]
                              for f in recompiles), [f.message for f in prof.findings]
    assert recompiles[0].message.startswith("between steps recompiled Shaped.forward()")
    by_step = {row["first_step"]: row for row in rows(tmp_path)}
    assert [s for s, row in by_step.items() if row["steps_excluded"]] == [0]  # the first compile
    assert by_step[3].get("compile_ms", 0) > 0 and by_step[3]["steps_excluded"] == 0
    total_ms = sum(row.get("compile_ms", 0.0) for row in by_step.values())
    assert total_ms == pytest.approx(prof.session.compile_s * 1e3, rel=0.01)


def test_without_compile_callbacks_recompiles_are_still_found(tmp_path: Path, monkeypatch,
                                                              caplog) -> None:
    """A torch without ``torch._dynamo.callback``: one info line; findings from the metrics."""
    import logging

    import torch._dynamo.callback

    monkeypatch.delattr(torch._dynamo.callback, "callback_handler")
    model = torch.compile(Shaped(), backend="aot_eager", dynamic=False)
    prof = StepProfiler(tmp_path, **QUIET)
    with caplog.at_level(logging.INFO, logger="profcallbacks"):
        train(prof, model, [4] * 3 + [5] * 3)
    said = [r.getMessage() for r in caplog.records if "compile callbacks" in r.getMessage()]
    assert len(said) == 1 and "not measured" in said[0]
    recompiles = kinds(prof.findings, RECOMPILE)
    assert len(recompiles) == 1 and recompiles[0].details["changed"] == "x.size(1)"
    assert prof.session.compile_s == 0.0
    assert not any(row.get("compile_ms") for row in rows(tmp_path))
