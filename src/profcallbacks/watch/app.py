"""The ``profcallbacks watch`` loop: poll the log directory, redraw, until Ctrl-C."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.live import Live

from profcallbacks.options.checks import check_int, check_number
from profcallbacks.watch.state import LogdirState
from profcallbacks.watch.view import render

PLAIN_WIDTH = 120
"""Columns of the plain-text frames written when the output is not a terminal."""


@dataclass(frozen=True)
class WatchOptions:
    """Options of ``profcallbacks watch``.

    Args:
        interval_s: Seconds between refreshes.
        once: Print one frame and return.
        max_rank_rows: Ranks shown one per row; with more, one all-rank summary row and the slowest.
        max_findings: Latest findings shown.
        report: A report JSON to take verdicts from (re-read when it changes), or ``None``.

    Example:
        >>> WatchOptions(interval_s=0.5).interval_s
        0.5
    """

    interval_s: float = 1.0
    once: bool = False
    max_rank_rows: int = 16
    max_findings: int = 8
    report: Path | None = None

    def __post_init__(self) -> None:
        check_number("WatchOptions", "interval_s", self.interval_s, minimum=0.05, example=1.0)
        check_int("WatchOptions", "max_rank_rows", self.max_rank_rows, minimum=2, example=16)
        check_int("WatchOptions", "max_findings", self.max_findings, minimum=0, example=8)


def watch(logdir: Path, options: WatchOptions, *, stream: TextIO | None = None) -> int:
    """Shows ``logdir`` live until Ctrl-C (exit status 0); with ``options.once``, one frame.

    On a terminal the frame is redrawn on the alternate screen (rich ``Live``, redrawn whole at the
    terminal's size each second) and the last frame is printed on exit; elsewhere a plain-text frame
    is written each time something new was read.

    Returns:
        The exit status: 0, or 2 with ``once`` when ``logdir`` does not exist.
    """
    out = stream if stream is not None else sys.stdout
    tty = out.isatty()
    console = Console(file=out, force_terminal=tty or None, width=None if tty else PLAIN_WIDTH,
                      no_color=not tty, highlight=False, soft_wrap=not tty,
                      markup=False)  # nothing read from the log directory is ever markup
    state = LogdirState(logdir, report=options.report)
    state.poll()
    frame = lambda: render(state, max_rank_rows=options.max_rank_rows,  # noqa: E731
                           max_findings=options.max_findings)
    if options.once:
        console.print(frame())
        return 0 if state.exists else 2
    try:
        if tty:
            try:  # the alternate screen, redrawn whole: a resize or a tall frame leaves no debris
                with Live(frame(), console=console, auto_refresh=False, screen=True) as live:
                    while True:
                        time.sleep(options.interval_s)
                        state.poll()
                        live.update(frame(), refresh=True)  # every tick: the clock and a resize
            finally:
                console.print(frame())  # the last frame stays on the normal screen
        else:
            console.print(frame())
            out.flush()
            while True:
                time.sleep(options.interval_s)
                if state.poll():
                    console.rule()
                    console.print(frame())
                    out.flush()
    except KeyboardInterrupt:
        return 0
