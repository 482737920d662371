"""The package's shape: layers that import only downwards, no import cycles, a short top level,
one on-disk contract."""

import ast
from pathlib import Path

from profcallbacks import layout

PACKAGE = Path(__file__).parents[1] / "src" / "profcallbacks"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports, counting every import statement anywhere in it
    (inside functions and under TYPE_CHECKING too)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.add(full if full in modules else base)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                found.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


LAYERS = [
    ("options", "_version"),  # every option, validated, with its bounds: imports nothing else
    ("core",),  # step timing, ranks, device timing, trigger names, faults, shared trace names
    ("layout",),  # every name on disk, for the writers and the readers
    ("findings",),  # finding kinds and where findings go
    ("detect", "capture"),  # the detectors; the capture windows and the trace export
    ("report",),  # the trace and log-directory reader (the straggler rule is detect's)
    ("watch", "viewer"),  # the live terminal view; a capture served to the Perfetto UI
    ("run",),  # the orchestrator: the session drives the captures, detectors and sinks
    ("integrations",),  # tracker backends: W&B, MLflow, Lightning loggers, HF report_to
    ("loop", "lightning_fetch", "testing"),  # the plain-loop front end; test doubles
    ("lightning", "hf"),  # the framework front ends
    ("__init__", "cli"),  # the public names; the command line
]
"""Floors, lowest first: a part imports only parts on lower floors (none on its own floor)."""


def part(module: str) -> str:
    """A module's top-level part: its first path component below the package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def upward_imports(graph: dict[str, set[str]], layers=LAYERS) -> list[tuple[str, str]]:
    """(importer, imported) pairs that do not go down the floors of ``layers``."""
    floor = {name: level for level, names in enumerate(layers) for name in names}
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if part(a) != part(b) and floor[part(b)] >= floor[part(a)])


def test_every_part_is_on_a_floor():
    floors = {name for names in LAYERS for name in names}
    assert {part(m) for m in import_graph()} == floors


def test_each_part_imports_only_parts_below_it():
    assert upward_imports(import_graph()) == []


def test_the_layer_check_finds_an_upward_or_sideways_import():
    graph = {"profcallbacks.core.timing": {"profcallbacks.run.session"},
             "profcallbacks.capture.trace_writer": {"profcallbacks.detect.stall"},
             "profcallbacks.run.session": {"profcallbacks.core.timing"}}
    assert upward_imports(graph) == [
        ("profcallbacks.capture.trace_writer", "profcallbacks.detect.stall"),
        ("profcallbacks.core.timing", "profcallbacks.run.session")]


def test_options_import_nothing_else_of_the_package():
    graph = import_graph()
    assert {t for m, targets in graph.items() if part(m) == "options" for t in targets
            if part(t) != "options"} == set()


def test_capture_names_no_report_module():
    """Not even by name for importlib: the session hands the live analysis to the exporter."""
    named = [p.name for p in (PACKAGE / "capture").glob("*.py")
             if "profcallbacks.report" in p.read_text(encoding="utf-8")]
    assert named == []


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_at_most_twelve_modules_at_the_top_level():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 12, top


def test_writer_names_parse_back():
    assert layout.parse_capture_dir(layout.capture_dir_name(42, "slowdown", partial=True)) == (
        42, "slowdown", True)
    assert layout.TRACE_FILE.match(layout.trace_file_name("rank3_node-a", 120)).group(1) == "rank3_node-a"
    for path, kind in ((layout.steps_file(Path("x"), 7), "steps"),
                       (layout.findings_file(Path("x"), 7), "findings")):
        assert path.parent.name == layout.META_DIR
        assert layout.parse_rank_file(path.name) == (7, kind)


def test_public_names_and_a_command_line_without_torch():
    """`profcallbacks report`/`watch` start without importing torch; the public names still resolve."""
    import subprocess
    import sys

    import profcallbacks

    code = ("import sys, profcallbacks.cli, profcallbacks.report, profcallbacks.watch; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
    assert set(profcallbacks.__all__) == set(dir(profcallbacks))
    for name in profcallbacks.__all__:
        assert getattr(profcallbacks, name) is not None


VOCABULARY_MODULE = "profcallbacks.core.trace_names"
VOCABULARY_STRAGGLERS = {
    # Modules that still spell vocabulary names; each entry must still hold one (the test below
    # fails on a stale entry), so the list only shrinks.
    "profcallbacks.capture.pieces": "writer side: the profiler's span and flow categories",
    "profcallbacks.capture.postprocess": "writer side: writes ProfilerStep# ranges and categories",
    "profcallbacks.loop": "writes the loader range torch's DataLoader would",
    "profcallbacks.report.analyse.diagnoses.copies": "rule module",
    "profcallbacks.report.analyse.diagnoses.host_waits": "rule module",
    "profcallbacks.report.analyse.diagnoses.loader": "rule module",
    "profcallbacks.report.analyse.diagnoses.optimizer": "rule module",
    "profcallbacks.report.analyse.diagnoses.precision": "rule module",
    "profcallbacks.report.analyse.diagnoses.startup": "rule module",
}


def vocabulary() -> tuple[set[str], tuple[str, ...]]:
    """(names matched whole, prefixes) of the trace vocabulary module; ``"nccl"`` alone is also
    the backend's name, so only the vocabulary's longer names of collectives count."""
    from profcallbacks.core import trace_names as v

    exact = {value for value in vars(v).values() if isinstance(value, str) and not value.startswith("_")
             and "." not in value and value not in {v.__name__, v.__doc__, v.NCCL_KERNEL_PREFIX}}
    exact |= set(v.OLD_CATEGORIES) | set(v.HOST_ONLY_CATEGORIES) | set(v.SYNC_CALLS) | set(v.DEVICE_SYNCS)
    prefixes = (v.STEP_PREFIX, v.OPTIMIZER_PREFIX, *v.LOADER_PREFIXES, *v.LIGHTNING_PREFIXES,
                *v.COMM_PREFIXES, *v.COMPILED_PREFIXES)
    return exact, prefixes


def vocabulary_literals(source: str, exact: set[str], prefixes: tuple[str, ...]) -> list[str]:
    """``line: 'literal'`` for each string in ``source`` (docstrings aside) that is a vocabulary
    name, or starts with a vocabulary prefix (f-strings too)."""
    tree = ast.parse(source)
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)
                  and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}
    docstrings |= {id(item) for node in ast.walk(tree) if isinstance(node, ast.Assign)  # __all__
                   and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
                   for item in ast.walk(node.value)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            head = node.values[0].value
            if isinstance(head, str) and head.startswith(prefixes):
                found.append(f"{node.lineno}: f{head!r}...")
            for value in node.values:  # the pieces are constants too: not looked at again
                docstrings.add(id(value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docstrings \
                and (node.value in exact or node.value.startswith(prefixes)):
            found.append(f"{node.lineno}: {node.value!r}")
    return sorted(set(found), key=lambda s: int(s.split(":")[0]))


def test_the_trace_vocabulary_is_written_only_in_its_module():
    exact, prefixes = vocabulary()
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    written = {name: vocabulary_literals(path.read_text(encoding="utf-8"), exact, prefixes)
               for name, path in sorted(modules.items()) if name != VOCABULARY_MODULE}
    assert {n: lines for n, lines in written.items() if lines and n not in VOCABULARY_STRAGGLERS} == {}
    assert [n for n in VOCABULARY_STRAGGLERS if not written.get(n)] == []


def test_the_vocabulary_check_finds_a_written_name():
    exact, prefixes = vocabulary()
    source = ('"""ProfilerStep# in a docstring is prose."""\n'
              'STEP = "ProfilerStep#"\nmark = f"ProfilerStep#{7}"\n'
              'if cat == "gpu_memcpy": pass\nmessage = "no kernel ranges"\n')
    assert vocabulary_literals(source, exact, prefixes) == [
        "2: 'ProfilerStep#'", "3: f'ProfilerStep#'...", "4: 'gpu_memcpy'"]


REPORT_STAGES = [
    ("model",),  # the typed model of a trace: intervals, the capture model, FLOPs from shapes
    ("read",),  # find a run's files, decode any trace generation, stream, one pass into the model
    ("analyse",),  # breakdowns, verdicts, diagnoses, advice, growth, statistics, throughput
    ("render",),  # text, HTML, plots
    ("__init__", "build", "capture_findings", "compare", "gate", "notebook", "rank_meeting", "runs",
     "summarize", "trace_reads"),  # facades
]
"""The report's stages, lowest first: data flows down read -> model -> analyse -> render; a module
imports only its own stage or lower ones (the read stage fills the model, so it sits above it)."""
DECODERS = {"profcallbacks.report.read.decode", "profcallbacks.report.read.stream",
            "profcallbacks.report.read.frames"}
WALKERS = {"build_capture", "scan", "summarise", "normalise", "load_trace", "stream_trace", "slim",
           "decode_events", "trace_model"}
"""Functions of the read stage that walk a trace's events: called only from the read stage."""
STAGE_STRAGGLERS = {
    # Each entry must still break the rule (the test below fails on a stale entry).
    "profcallbacks.report.analyse.diagnoses.registry": "diagnose_events builds the capture model "
    "from events itself; callers use analyse/captures.py's capture_expert over the model",
}


def stage(module: str) -> str | None:
    """The report stage of ``module`` (``None`` outside ``profcallbacks.report``)."""
    parts = module.split(".")
    if parts[:2] != ["profcallbacks", "report"]:
        return None
    name = parts[2] if len(parts) > 2 else "__init__"
    return next(s for names in REPORT_STAGES for s in names if s == name)


def stage_breaches(graph: dict[str, set[str]], walked: dict[str, set[str]]) -> list[str]:
    """``importer -> imported`` going up the stages, and ``module: walks events (how)`` for a
    module outside the read stage that decodes or walks trace events."""
    floor = {name: level for level, names in enumerate(REPORT_STAGES) for name in names}
    out = [f"{a} -> {b}" for a, targets in graph.items() for b in sorted(targets)
           if stage(a) and stage(b) and floor[stage(b)] > floor[stage(a)]]
    out += [f"{m}: walks events ({', '.join(sorted(how))})" for m, how in walked.items()
            if how and stage(m) not in (None, "read")]
    return sorted(out)


def event_walking(path: Path, graph_targets: set[str]) -> set[str]:
    """How the module at ``path`` decodes or walks trace events: decoder modules it imports,
    read-stage walkers it imports, ``.traceEvents`` it reads."""
    how = {t for t in graph_targets if t in DECODERS}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("profcallbacks.report.read"):
            how |= {a.name for a in node.names if a.name in WALKERS}
        elif isinstance(node, ast.Attribute) and node.attr == "traceEvents":
            how.add(".traceEvents")
    return how


def test_report_stages_flow_down_and_only_the_read_stage_walks_events():
    graph = import_graph()
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    assert {stage(m) for m in graph if stage(m)} == {s for names in REPORT_STAGES for s in names}
    walked = {m: event_walking(p, graph[m]) for m, p in modules.items() if stage(m)}
    breaches = stage_breaches(graph, walked)
    assert [b for b in breaches if b.split(" ")[0].rstrip(":") not in STAGE_STRAGGLERS] == []
    assert [m for m in STAGE_STRAGGLERS if not any(b.startswith(m) for b in breaches)] == []


def test_the_stage_check_finds_an_upward_import_and_a_walker():
    graph = {"profcallbacks.report.read.traces": {"profcallbacks.report.analyse.expert"},
             "profcallbacks.report.render.text": {"profcallbacks.report.analyse.verdict"},
             "profcallbacks.report.analyse.gpu_breakdown": {"profcallbacks.report.read.decode"}}
    walked = {"profcallbacks.report.analyse.gpu_breakdown": {"profcallbacks.report.read.decode"},
              "profcallbacks.report.read.traces": {"slim"}}
    assert stage_breaches(graph, walked) == [
        "profcallbacks.report.analyse.gpu_breakdown: walks events (profcallbacks.report.read.decode)",
        "profcallbacks.report.read.traces -> profcallbacks.report.analyse.expert"]
