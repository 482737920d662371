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
