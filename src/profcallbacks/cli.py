"""The ``profcallbacks`` command line: ``report LOGDIR``, ``compare RUN_A RUN_B``, ``watch LOGDIR``,
``open LOGDIR|TRACE`` and ``summarize DIR``.

Exit status: 0 when something was read (files that could not be read are named on stderr), 1 when
nothing in the log directory could be read, 2 for a path that does not exist or holds no run.
``compare`` with a gate (``--fail-if-slower``, ``--fail-on-new-findings``): 0 passed, 1 regression,
2 refused (a run too short to compare, or missing). ``watch``: 0 after Ctrl-C. ``open``: 0 once the
trace was fetched (or Ctrl-C), 2 when there is nothing to open or the port is taken.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path
from typing import Any

from profcallbacks._version import __version__
from profcallbacks.report.gate import DEFAULT_MIN_STEPS, METRICS


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
    report.add_argument("--peak-tflops", type=_positive, metavar="TFLOPS",
                        help="the device's dense peak (TFLOP/s) for MFU, for a device the "
                             "built-in table lacks")
    report.add_argument("--no-summaries", action="store_true",
                        help="parse every trace, even where its summary (<trace>.summary) "
                             "still matches it")
    report.add_argument("--processes", type=int, default=None,
                        help="processes parsing traces at once (default: up to the usable "
                             "cores when there are 16 MB of traces or more to parse; 1: one "
                             "file at a time)")
    summarize = sub.add_parser(
        "summarize", help="write a summary next to each trace of a directory",
        description="Write <trace>.summary next to each trace of DIR (traces the training "
                    "job did not summarise itself), so `report`, `compare` and `watch` read "
                    "kilobytes instead of the traces. Under torchrun or srun each rank takes "
                    "every WORLD_SIZE-th file and rank 0 prints the totals.")
    summarize.add_argument("logdir", type=Path, metavar="DIR")
    summarize.add_argument("--processes", type=int, default=1,
                           help="worker processes on this machine (default 1)")
    summarize.add_argument("--force", action="store_true",
                           help="rewrite summaries that still match their trace")
    compare = sub.add_parser("compare", help="what changed between two log directories",
                             description="What changed from RUN_A to RUN_B: step time, data-wait "
                                         "share, top operators and findings.")
    compare.add_argument("run_a", type=Path, metavar="RUN_A")
    compare.add_argument("run_b", type=Path, metavar="RUN_B")
    compare.add_argument("--format", choices=("text", "json"), default="text")
    compare.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    compare.add_argument("--top", type=int, default=15, help="operators to list (default 15)")
    compare.add_argument("--fail-if-slower", type=float, metavar="PCT",
                         help="exit 1 when RUN_B's metric is more than PCT%% above RUN_A's (percentage "
                              "points for data_wait_share); exit 2 when a run is too short to tell")
    compare.add_argument("--metric", choices=tuple(METRICS), default="median_step",
                         help="what --fail-if-slower compares (default median_step)")
    compare.add_argument("--fail-on-new-findings", metavar="KIND,...",
                         help="exit 1 when RUN_B has findings of these kinds (or 'any') and RUN_A none")
    compare.add_argument("--min-steps", type=int, default=DEFAULT_MIN_STEPS,
                         help=f"steps each run needs for the gate (default {DEFAULT_MIN_STEPS})")
    watch = sub.add_parser("watch", help="live view of a log directory in the terminal",
                           description="Live view of a log directory: per-rank step time, data wait, "
                                       "captures and findings, read from its files only (also over "
                                       "ssh, also after the job). Ctrl-C to stop.")
    watch.add_argument("logdir", type=Path, metavar="LOGDIR")
    watch.add_argument("--once", action="store_true", help="print one frame and exit")
    watch.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    watch.add_argument("--ranks", type=int, default=16,
                       help="ranks shown one per row; with more, a summary row and the slowest (default 16)")
    watch.add_argument("--findings", type=int, default=8, help="latest findings shown (default 8)")
    watch.add_argument("--report", type=Path, metavar="FILE",
                       help="take verdicts from this report JSON (profcallbacks report --format json "
                            "-o FILE), re-read when it changes")
    view = sub.add_parser("open", help="open a capture in the Perfetto UI (served once from 127.0.0.1)",
                          description="Serves one trace once from 127.0.0.1 to the Perfetto UI "
                          "(https://ui.perfetto.dev, which needs the internet) and opens it in the "
                          "browser: by default the latest capture, merged when it has several ranks. "
                          "Offline, `profcallbacks report --format html` is the viewer.")
    view.add_argument("path", type=Path, metavar="LOGDIR|TRACE")
    view.add_argument("--capture", metavar="NAME", help="capture directory (default: the latest)")
    which = view.add_mutually_exclusive_group()
    which.add_argument("--rank", type=int, metavar="N", help="open this rank's trace")
    which.add_argument("--merged", action="store_true", help="open the merged trace of all ranks")
    view.add_argument("--port", type=int, default=9001, help="loopback port to serve from (default 9001)")
    view.add_argument("--no-browser", action="store_true", help="print the URL without opening a browser")
    return parser


def _open(args: argparse.Namespace) -> int:
    from profcallbacks.report.render.safe import visible
    from profcallbacks.viewer import ChoiceError, ServeError, choose_trace, serve_once

    if not 0 <= args.port < 65536:
        print(f"profcallbacks: --port must be 0-65535 (0: any free port), got {args.port}",
              file=sys.stderr)
        return 2
    try:
        trace = choose_trace(args.path, capture=args.capture, rank=args.rank, merged=args.merged)
        return serve_once(trace, port=args.port, browser=not args.no_browser, out=sys.stdout)
    except (ChoiceError, ServeError) as exc:
        print(visible(f"profcallbacks: {exc}"), file=sys.stderr)
        return 2


def _several_runs(path: Path, args: argparse.Namespace) -> int | None:
    """Lists the runs below ``path`` with their headlines when it holds more than one."""
    from profcallbacks.report.read.logdir import find_runs
    from profcallbacks.report.render.safe import dumps_strict, visible
    from profcallbacks.report.runs import render_runs_text, run_headlines

    try:
        runs = find_runs(path) if path.is_dir() else []
    except OSError:  # e.g. unreadable: the single-run path below names the problem
        return None
    if len(runs) < 2:
        return None
    rows = run_headlines(runs)
    if args.format == "json":
        return _emit(dumps_strict({"runs": rows}, indent=2) + "\n", args.output)
    if args.format == "html":
        print(visible(f"profcallbacks: {path} holds {len(runs)} runs; an HTML report is of one "
                      "run: give one of them"), file=sys.stderr)
        return 2
    return _emit(render_runs_text(str(path), rows), args.output)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"--peak-tflops must be a positive number of TFLOP/s "
                                         f"(e.g. 312 for an A100 in bf16), got {text!r}")
    return value


def _load(path: Path, top: int, peak_tflops: float | None = None, *,
          summaries: bool = True, processes: int | None = None) -> dict[str, Any] | None:
    from profcallbacks.report import NoRunError, build_report, locate_run
    from profcallbacks.report.render.safe import visible

    try:
        report = build_report(locate_run(path), top=top, peak_tflops=peak_tflops,
                              summaries=summaries, processes=processes)
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
    from profcallbacks.report.render.safe import dumps_strict

    if args.processes is not None and args.processes < 1:
        print(f"profcallbacks: --processes must be at least 1, got {args.processes}",
              file=sys.stderr)
        return 2
    listed = _several_runs(args.logdir, args)
    if listed is not None:
        return listed
    report = _load(args.logdir, args.top, args.peak_tflops, summaries=not args.no_summaries,
                   processes=args.processes)
    if report is None:
        return 2
    if not report["readable"] and args.format != "json":  # a blank report would say nothing
        print(f"profcallbacks: no report: nothing in {args.logdir} could be read (the reasons "
              "are above)", file=sys.stderr)
        return 1
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
    from profcallbacks.report.compare import ALL_OPERATORS
    from profcallbacks.report.gate import gate
    from profcallbacks.report.render.safe import dumps_strict

    a, b = _load(args.run_a, ALL_OPERATORS), _load(args.run_b, ALL_OPERATORS)
    gating = args.fail_if_slower is not None or bool(args.fail_on_new_findings)
    if a is None or b is None:
        if gating:
            print("refused: a run to compare is missing", file=sys.stderr)
        return 2
    cmp = compare_reports(a, b, top=args.top)
    verdict = None
    if gating:
        kinds = tuple(k.strip() for k in (args.fail_on_new_findings or "").split(",") if k.strip())
        verdict = gate(a, b, fail_if_slower=args.fail_if_slower, metric=args.metric,
                       fail_on_new_findings=kinds, min_steps=args.min_steps)
        cmp["gate"] = verdict
    text = dumps_strict(cmp, indent=2) + "\n" if args.format == "json" \
        else render_compare_text(cmp)
    status = _emit(text, args.output)
    for run, path in ((a, args.run_a), (b, args.run_b)):
        if not run["readable"]:
            print(f"profcallbacks: nothing in {path} could be read", file=sys.stderr)
            return 2 if gating else 1
    if verdict is not None:
        print(verdict["verdict"], file=sys.stderr)
        return max(status, int(verdict["exit_code"]))
    return status


def _summarize(args: argparse.Namespace) -> int:
    from profcallbacks.report import NoRunError, locate_run
    from profcallbacks.report.render.safe import visible
    from profcallbacks.report.summarize import (
        gather_counts,
        launcher_rank,
        share,
        summarize_files,
    )

    if args.processes < 1:
        print(f"profcallbacks: --processes must be at least 1, got {args.processes}",
              file=sys.stderr)
        return 2
    try:
        run = locate_run(args.logdir)
    except NoRunError as exc:
        print(visible(f"profcallbacks: {exc}"), file=sys.stderr)
        return 2
    files = sorted({f for c in run.captures for f in c.files})
    rank, world_size = launcher_rank()
    mine = share(files, rank, world_size)
    if world_size > 1:
        print(f"profcallbacks: rank {rank} of {world_size} summarises {len(mine)} of "
              f"{len(files)} traces", file=sys.stderr)
    result = gather_counts(summarize_files(mine, processes=args.processes, force=args.force),
                           rank, world_size, run.root)
    for path, why in result.failed if rank == 0 else []:
        print(visible(f"profcallbacks: no summary for {path}: {why}"), file=sys.stderr)
    if rank == 0:
        print(f"profcallbacks: {result.written} summaries written, {result.kept} kept (still "
              f"matching), {len(result.failed)} failed, of {len(files)} traces"
              + (f" over {world_size} ranks" if world_size > 1 else ""))
    return 1 if files and len(result.failed) == len(files) else 0


def _watch(args: argparse.Namespace) -> int:
    from profcallbacks.watch import WatchOptions, watch

    try:
        options = WatchOptions(interval_s=args.interval, once=args.once, max_rank_rows=args.ranks,
                               max_findings=args.findings, report=args.report)
    except ValueError as exc:
        print(f"profcallbacks: {exc}", file=sys.stderr)
        return 2
    return watch(args.logdir, options)


def _tolerate_ascii_terminals() -> None:
    """Under an ASCII locale (``LC_ALL=C`` without UTF-8 mode) a path or a sign the terminal
    cannot encode is written as a backslash escape instead of ending the command."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and "utf" not in (stream.encoding or "").lower():
            stream.reconfigure(errors="backslashreplace")


def main(argv: list[str] | None = None) -> int:
    _tolerate_ascii_terminals()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if getattr(args, "top", 1) < 1:
        parser.error(f"--top must be at least 1, got {args.top}")
    if getattr(args, "min_steps", 1) < 1:
        parser.error(f"--min-steps must be at least 1, got {args.min_steps}")
    if getattr(args, "fail_if_slower", None) is not None and not args.fail_if_slower >= 0:
        parser.error(f"--fail-if-slower must be a percentage of at least 0, got {args.fail_if_slower}")
    commands = {"report": _report, "compare": _compare, "watch": _watch, "open": _open,
                "summarize": _summarize}
    try:
        return commands[args.command](args)
    except KeyboardInterrupt:
        print("profcallbacks: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `profcallbacks report runs/x | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
