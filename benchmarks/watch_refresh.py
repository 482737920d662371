"""Cost of one `profcallbacks watch` refresh: reading what was appended and rendering a frame.

Run: python benchmarks/watch_refresh.py [--ranks 64] [--rows 5000]

Writes a log directory of RANKS steps files with ROWS summaries each (a long run) and 20 captures,
then times: the first poll (reads everything), a refresh after one new row per rank (reads only the
appended bytes), and rendering one frame to a string. A refresh must stay far below its 1 s period.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console

from profcallbacks.layout import META_DIR, capture_dir_name
from profcallbacks.watch.state import LogdirState
from profcallbacks.watch.view import render


def row(rank: int, index: int) -> str:
    return json.dumps({"rank": rank, "first_step": index * 50, "last_step": index * 50 + 49, "steps": 50,
                       "step_time_ms": 101.0, "step_time_ms_median": 100.0 + index % 7,
                       "step_time_ms_max": 140.0, "data_wait_ms": 5.0, "data_wait_share": 0.05}) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--rows", type=int, default=5000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        logdir = Path(tmp)
        (logdir / META_DIR).mkdir()
        for rank in range(args.ranks):
            text = "".join(row(rank, i) for i in range(args.rows))
            (logdir / META_DIR / f"rank{rank}.steps.jsonl").write_text(text)
        for i in range(20):
            (logdir / capture_dir_name(i * 500, "schedule")).mkdir()
        state = LogdirState(logdir)
        start = time.perf_counter()
        state.poll()
        first = time.perf_counter() - start
        refreshes, renders = [], []
        for n in range(20):
            for rank in range(args.ranks):
                with open(logdir / META_DIR / f"rank{rank}.steps.jsonl", "a") as f:
                    f.write(row(rank, args.rows + n))
            start = time.perf_counter()
            state.poll()
            refreshes.append(time.perf_counter() - start)
            console = Console(file=io.StringIO(), width=140)
            start = time.perf_counter()
            console.print(render(state))
            renders.append(time.perf_counter() - start)
    print(f"{args.ranks} ranks x {args.rows} summaries, 20 captures")
    print(f"first poll (reads everything):       {first * 1e3:8.1f} ms")
    print(f"refresh (one new row per rank):      {statistics.median(refreshes) * 1e3:8.1f} ms (median of 20)")
    print(f"render one frame:                    {statistics.median(renders) * 1e3:8.1f} ms (median of 20)")


if __name__ == "__main__":
    main()
