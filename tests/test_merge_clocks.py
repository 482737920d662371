"""Which ranks the merged trace shifts, on fixed times: ranks of one host share its clock."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from profcallbacks.capture.merge import merge_capture

ENDS = [10_000.0 * k + 500.0 for k in range(6)]
"""Where each all-reduce ends on rank 0's clock (us)."""


def rank_file(tmp_path: Path, rank: int, host: str, late_us: list[float]) -> Path:
    """A rank's trace whose k-th all-reduce ends ``late_us[k]`` after rank 0's, on its clock."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "gloo:all_reduce", "pid": 1, "tid": 1,
               "ts": end + late - 100.0, "dur": 100.0} for end, late in zip(ENDS, late_us, strict=True)]
    trace = {"traceEvents": events, "baseTimeNanoseconds": 1_000_000_000,
             "distributedInfo": {"rank": rank}, "profcallbacks": {"rank": rank, "host": host}}
    path = tmp_path / f"rank{rank}.pt.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps(trace).encode()))
    return path


def test_one_shift_per_host_and_none_on_the_first_ranks_host(tmp_path):
    # Reasoning: rank 1 shares rank 0's host, so its clock: its ends 2 ms late in four of six
    # all-reduces are its own lateness (descheduled before it recorded them), not a clock to
    # shift. Host b's clock runs 5 ms ahead: both its ranks move back 5 ms, rank 3's one late end
    # outvoted by the densest half of the pooled ends. Ranks of an unknown host ("localhost"
    # may be any machine) get a shift each: 3 ms early, +3 ms; 7 ms late, -7 ms.
    files = [rank_file(tmp_path, 0, "a", [0.0] * 6),
             rank_file(tmp_path, 1, "a", [2_000.0, 2_000.0, 0.0, 2_000.0, 0.0, 2_000.0]),
             rank_file(tmp_path, 2, "b", [5_000.0] * 6),
             rank_file(tmp_path, 3, "b", [5_000.0] * 5 + [9_000.0]),
             rank_file(tmp_path, 4, "localhost", [-3_000.0] * 6),
             rank_file(tmp_path, 5, "localhost", [7_000.0] * 6)]
    meta = merge_capture(files, tmp_path / "all-ranks.1.trace.json.gz", budget_bytes=None)
    assert {r["rank"]: r["offset_us"] for r in meta["ranks"]} == {
        0: 0.0, 1: 0.0, 2: -5_000.0, 3: -5_000.0, 4: 3_000.0, 5: -7_000.0}
    residual = {r["rank"]: r["residual_skew_us"] for r in meta["ranks"]}
    assert residual[1] == {"median": 2_000.0, "max": 2_000.0}  # its lateness, left as it was
    assert residual[3]["max"] == 4_000.0 and residual[2]["max"] == 0.0
