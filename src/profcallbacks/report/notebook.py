"""The report inline in a Jupyter notebook: ``Report`` and the profiler render themselves as HTML.

A notebook shows an object's ``_repr_html_()``. The fragment is the offline HTML report's body
(verdicts, the step-time plot, findings, captures, operators) with its style scoped to the
fragment, so it changes nothing else on the notebook's page; like the page, it holds no script
and fetches nothing.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from profcallbacks.report.build import NoRunError, build_report, locate_run
from profcallbacks.report.render.html import _CSS, _e, render_html

SCOPE = "profcallbacks-report"
"""Class of the element that holds an inline report; every style rule is scoped to it."""
_RULE = re.compile(r"([^{}]+)\{([^{}]*)\}")


class Report:
    """The report of one log directory: ``profcallbacks report`` as an object.

    Args:
        data: The report as ``profcallbacks report --format json`` writes it.

    Example:
        >>> report = Report.load("runs/exp1")        # doctest: +SKIP
        >>> report                                  # doctest: +SKIP
        (in Jupyter: the verdict, step-time plot and findings, inline)
    """

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    @classmethod
    def load(cls, logdir: str | os.PathLike[str], *, top: int = 15) -> Report:
        """Read ``logdir`` (a run's log directory or one trace file)."""
        return cls(build_report(locate_run(Path(logdir)), top=top))

    @property
    def verdict(self) -> dict[str, Any] | None:
        """What bounds the run (``kind``, ``share``, ``evidence``, ``advice``), or ``None``."""
        verdict = self.data.get("verdict")
        return verdict if isinstance(verdict, dict) else None

    def html(self) -> str:
        """The complete offline page, as ``--format html`` writes it."""
        return render_html(self.data)

    def _repr_html_(self) -> str:
        page = self.html()
        body = page.split("<body>\n", 1)[1].rsplit("\n</body>", 1)[0]
        return f'<div class="{SCOPE}"><style>{scoped_css(_CSS)}</style>{body}</div>'


def logdir_html(logdir: Path) -> str:
    """The inline report of ``logdir``, or one line saying there is nothing to show yet."""
    try:
        return Report.load(logdir)._repr_html_()
    except (NoRunError, OSError) as exc:
        return (f'<div class="{SCOPE}"><p>profcallbacks: nothing to show for '
                f"<code>{_e(str(logdir))}</code> yet ({_e(str(exc))}).</p></div>")


def scoped_css(css: str, scope: str = SCOPE) -> str:
    """Every rule of ``css`` limited to elements inside ``.scope`` (``body`` becomes ``.scope``).

    Example:
        >>> scoped_css("body{margin:0}h1,td.num{color:red}", "r")
        '.r{margin:0}.r h1,.r td.num{color:red}'
    """
    def rule(match: re.Match[str]) -> str:
        selectors = [s.strip() for s in match.group(1).split(",")]
        scoped = [f".{scope}" if s == "body" else f".{scope} {s}" for s in selectors]
        return ",".join(scoped) + "{" + match.group(2) + "}"

    return _RULE.sub(rule, css.replace("\n", ""))
