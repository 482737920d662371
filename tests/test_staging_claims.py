"""What a live process stages is never recovered as a killed run's: claims in staging."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from profcallbacks.capture.claims import live_claims
from profcallbacks.capture.trace_writer import recover_staging

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
