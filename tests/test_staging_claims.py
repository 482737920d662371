"""What a live process stages is never recovered as a killed run's: claims in staging."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from profcallbacks.capture.claims import StagingClaim, live_claims
from profcallbacks.capture.trace_writer import CaptureWriter, new_raw_trace_path, recover_staging
from profcallbacks.core.capture_info import CaptureInfo
from profcallbacks.core.ranks import RankInfo

STAGER = """
import sys
from pathlib import Path
from profcallbacks.capture.claims import StagingClaim
from profcallbacks.capture.trace_writer import new_raw_trace_path
from profcallbacks.core.capture_info import CaptureInfo
from profcallbacks.core.ranks import RankInfo
logdir = Path(sys.argv[1])
writer, saver = StagingClaim(logdir), StagingClaim(logdir)  # the helper's, the training's
info = CaptureInfo("step000005-schedule", "schedule", 5, (), False, 0, 0, RankInfo())
raw = new_raw_trace_path(logdir, info, saver)  # kineto's save, not yet read by the helper
raw.write_bytes(b'{"traceEvents": []}')
writer.add(info.name)  # a rank's complete file, waiting in its stage for the other rank's
stage = logdir / ".profcallbacks-staging" / info.name
stage.mkdir()
(stage / "rank1_h.5.pt.trace.json.gz.ready").write_bytes(b"x")
print(raw, flush=True)
sys.stdin.read()  # alive until told
"""


def _stage(logdir: Path) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen([sys.executable, "-c", STAGER, str(logdir)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def test_a_live_ranks_staged_files_are_left_alone_then_recovered_once_it_is_gone(tmp_path):
    proc, raw = _stage(tmp_path)
    staging = tmp_path / ".profcallbacks-staging"
    old = time.time() - 60  # older than this run's start: age alone says "leftover"
    for path in (raw.parent, staging / "step000005-schedule"):
        os.utime(path, (old, old))
    try:
        assert len(live_claims(staging, started=time.time())) == 2
        assert recover_staging(tmp_path, older_than=time.time()) == []
        assert raw.exists() and (staging / "step000005-schedule").is_dir()
        assert not (tmp_path / "step000005-schedule").exists()
    finally:
        proc.kill()
        proc.wait()
    done = recover_staging(tmp_path, older_than=time.time())  # killed: its claims are stale
    assert not raw.parent.exists()
    assert (tmp_path / "step000005-schedule" / "rank1_h.5.pt.trace.json.gz").exists()
    assert any("removed a raw trace" in line for line in done), done
    assert any("published stranded capture step000005-schedule" in line for line in done), done
    assert not staging.exists()


def test_a_claim_from_another_host_is_live_until_stale(tmp_path):
    staging = tmp_path / ".profcallbacks-staging"
    staging.mkdir()
    claim = staging / ".claim-0123456789ab"
    claim.write_text('{"host": "other-node", "pid": 1, "stages": ["step000005-schedule"]}')
    assert live_claims(staging, started=time.time()) == {"0123456789ab": ["step000005-schedule"]}
    old = time.time() - 120  # not refreshed for longer than CLAIM_STALE_S: that process is gone
    os.utime(claim, (old, old))
    assert live_claims(staging, started=time.time()) == {}
    assert not claim.exists()


# --- the wait at close: for the files live ranks still owe, not for a fixed time ---------------

NAME = "step000005-schedule"


def _raw_trace(tmp_path: Path, rank: int) -> tuple[Path, CaptureInfo]:
    """A real raw trace (kineto's save) of a few operators, as rank ``rank`` of two."""
    info = CaptureInfo(NAME, "schedule", 5, (), False, os.getpid(), 0,
                       RankInfo(rank=rank, world_size=2, host="h"))
    raw = new_raw_trace_path(tmp_path, info)
    with torch.profiler.profile() as prof:
        torch.ones(8, 8) @ torch.ones(8, 8)
    prof.export_chrome_trace(str(raw))
    return raw, info


def test_a_rank_closing_waits_for_the_file_a_live_rank_owes_and_publishes_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # rank 1 (alive, its window open) writes its file well after rank 0 closed: rank 0's
    # writer waits for it (no fixed wait: publish_timeout_s=0 is spent at once) and the
    # capture is published once, with both files
    published: list[tuple[str, list[str]]] = []

    def record(final: Path, trigger: str, files: list[str]) -> None:
        published.append((final.name, sorted(files)))

    raw0, info0 = _raw_trace(tmp_path, 0)
    raw1, info1 = _raw_trace(tmp_path, 1)
    rank1 = StagingClaim(tmp_path)  # rank 1's training process
    rank1.owe(NAME)
    writers = [CaptureWriter(tmp_path, tracing_ranks=2, publish_timeout_s=0.0,
                             owed_timeout_s=60.0, after_publish=record) for _ in range(2)]
    writers[0].export(raw0, info0)

    def late_rank1() -> None:
        time.sleep(1.5)
        writers[1].export(raw1, info1)
        rank1.paid(NAME)

    thread = threading.Thread(target=late_rank1)
    thread.start()
    start = time.monotonic()
    with caplog.at_level(logging.WARNING):
        writers[0].close()
    waited = time.monotonic() - start
    thread.join()
    writers[1].close()
    rank1.release()
    assert published == [(NAME, ["rank0_h.5.pt.trace.json.gz", "rank1_h.5.pt.trace.json.gz"])]
    assert 1.0 < waited < 30, waited
    assert "ranks' traces" not in caplog.text
    assert not (tmp_path / ".profcallbacks-staging").exists()


def test_a_file_no_live_rank_owes_is_not_waited_for_and_the_capture_says_partial(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    raw0, info0 = _raw_trace(tmp_path, 0)
    gone = StagingClaim(tmp_path)  # rank 1 owed it, then ended without writing it
    gone.owe(NAME)
    gone.release()
    writer = CaptureWriter(tmp_path, tracing_ranks=2, publish_timeout_s=0.0, owed_timeout_s=60.0)
    writer.export(raw0, info0)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING):
        writer.close()
    assert time.monotonic() - start < 5
    assert [p.name for p in (tmp_path / NAME).iterdir()] == ["rank0_h.5.pt.trace.json.gz"]
    assert f"capture {NAME} published with 1 of 2 ranks' traces" in caplog.text
