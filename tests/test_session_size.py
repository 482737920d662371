"""run/session.py stays the step state machine only: the log directory, the block buffer, the
participants' calls, the outputs and compile segmentation live in modules of their own."""

from pathlib import Path

SESSION = Path(__file__).parents[1] / "src" / "profcallbacks" / "run" / "session.py"


def test_session_module_stays_under_400_lines():
    lines = len(SESSION.read_text(encoding="utf-8").splitlines())
    assert lines < 400, f"run/session.py has {lines} lines: move an idea into its own module"
