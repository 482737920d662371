"""The ``profcallbacks`` command line: ``report LOGDIR`` and ``compare RUN_A RUN_B``.

Exit status: 0 when something was read (files that could not be read are named on stderr), 1 when
nothing in the log directory could be read, 2 for a path that does not exist or holds no run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from profcallbacks._version import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="profcallbacks",
        description="Summarise profcallbacks log directories: traces, step times and findings.",
    )
    parser.add_argument("--version", action="version", version=f"profcallbacks {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    report = sub.add_parser("report", help="summarise one log directory",
                            description="Summarise one log directory: step times, breakdown, captures, "
                                        "top operators and findings. Reads only the log directory.")
    report.add_argument("logdir", type=Path, metavar="LOGDIR")
    report.add_argument("--format", choices=("text", "json", "html"), default="text")
    report.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    report.add_argument("--top", type=int, default=15, help="operators to list (default 15)")
    compare = sub.add_parser("compare", help="what changed between two log directories",
                             description="What changed from RUN_A to RUN_B: step time, data-wait "
                                         "share, top operators and findings.")
    compare.add_argument("run_a", type=Path, metavar="RUN_A")
    compare.add_argument("run_b", type=Path, metavar="RUN_B")
    compare.add_argument("--format", choices=("text", "json"), default="text")
    compare.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    compare.add_argument("--top", type=int, default=15, help="operators to list (default 15)")
    return parser


def _load(path: Path, top: int) -> dict[str, Any] | None:
    from profcallbacks.report import NoRunError, build_report, locate_run
    from profcallbacks.report.safe import visible

    try:
        report = build_report(locate_run(path), top=top)
    except NoRunError as exc:
        print(visible(f"profcallbacks: {exc}"), file=sys.stderr)
        return None
    for problem in report["problems"]:
        print(visible(f"profcallbacks: skipped {problem['file']}: {problem['error']}"),
              file=sys.stderr)
    return report


def _emit(text: str, output: Path | None) -> int:
    if output is None:
        sys.stdout.write(text)
        return 0
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        print(f"profcallbacks: cannot write {output}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"profcallbacks: wrote {output}", file=sys.stderr)
    return 0


def _report(args: argparse.Namespace) -> int:
    from profcallbacks.report import render_html, render_text
    from profcallbacks.report.safe import dumps_strict

    report = _load(args.logdir, args.top)
    if report is None:
        return 2
    if args.format == "json":
        text = dumps_strict(report, indent=2) + "\n"  # NaN/Infinity as null: strict JSON
    elif args.format == "html":
        text = render_html(report)
    else:
        text = render_text(report)
    status = _emit(text, args.output)
    if not report["readable"]:
        print(f"profcallbacks: nothing in {args.logdir} could be read", file=sys.stderr)
        return 1
    return status


def _compare(args: argparse.Namespace) -> int:
    from profcallbacks.report import compare_reports, render_compare_text
    from profcallbacks.report.safe import dumps_strict

    a, b = _load(args.run_a, args.top), _load(args.run_b, args.top)
    if a is None or b is None:
        return 2
    cmp = compare_reports(a, b, top=args.top)
    text = dumps_strict(cmp, indent=2) + "\n" if args.format == "json" \
        else render_compare_text(cmp)
    status = _emit(text, args.output)
    for run, path in ((a, args.run_a), (b, args.run_b)):
        if not run["readable"]:
            print(f"profcallbacks: nothing in {path} could be read", file=sys.stderr)
            return 1
    return status


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if getattr(args, "top", 1) < 1:
        parser.error(f"--top must be at least 1, got {args.top}")
    try:
        return _report(args) if args.command == "report" else _compare(args)
    except KeyboardInterrupt:
        print("profcallbacks: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `profcallbacks report runs/x | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
