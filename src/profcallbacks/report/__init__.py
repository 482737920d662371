"""``profcallbacks report`` / ``compare``: a log directory summarised as text, JSON or HTML.

Example:
    >>> from pathlib import Path
    >>> from profcallbacks.report import build_report, locate_run, render_text  # doctest: +SKIP
    >>> print(render_text(build_report(locate_run(Path("runs/exp1")))))  # doctest: +SKIP
"""

from profcallbacks.report.build import SCHEMA_VERSION, NoRunError, build_report, locate_run
from profcallbacks.report.compare import compare_reports, render_compare_text
from profcallbacks.report.render.html import render_html
from profcallbacks.report.render.text import render_text

__all__ = ["SCHEMA_VERSION", "NoRunError", "build_report", "compare_reports", "locate_run",
           "render_compare_text", "render_html", "render_text"]
