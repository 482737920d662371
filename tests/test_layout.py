"""The package's shape: no import cycles, a short top level, one on-disk contract."""

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
