"""A run suspended past the marker's takeover (another host took the log directory over)
notices at its next refresh, warns once and writes its own files to names of its own."""

from __future__ import annotations

import json
import logging
import os
import time

from helpers import tiny_model, train_step
from profcallbacks import StepProfiler
from profcallbacks.findings import Finding
from profcallbacks.layout import META_DIR, findings_file, parse_rank_file, run_lock_file, steps_file
from profcallbacks.report.read.files import read_jsonl
from profcallbacks.run import runlock, sinks


def test_a_run_that_lost_its_marker_stops_writing_the_shared_files(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(runlock, "HEARTBEAT_S", 0.05)
    monkeypatch.setattr(sinks, "STEPS_FLUSH_S", 0.0)  # every summary written at once
    model, opt = tiny_model()
    marker = run_lock_file(tmp_path)
    other = {"host": "host-b", "pid": 4242, "token": "b" * 32, "started": time.time()}
    with caplog.at_level(logging.WARNING), StepProfiler(
            tmp_path, schedule=None, log_every_n_steps=5, stall=None, slowdown=None,
            sync_audit=False, memory=None, tensorboard_scalars=False) as prof:
        for step in range(40):
            if step == 20:  # host B takes the marker over while this run is suspended
                tmp = marker.with_name(".takeover")
                tmp.write_text(json.dumps(other))
                os.replace(tmp, marker)
                deadline = time.monotonic() + 10  # this run resumes: its next refresh
                while "lost its marker" not in caplog.text and time.monotonic() < deadline:
                    time.sleep(0.02)  # finds the marker taken
            train_step(model, opt)
            time.sleep(0.03)  # steps long enough that blocks (and their summaries) end often
            prof.step()
            if step == 30:
                prof.session.emit(Finding("dataloader_stall", step=step, rank=0,
                                          severity="info", message="after the takeover"))
    lost = [r for r in caplog.records if "lost its marker" in r.getMessage()]
    assert len(lost) == 1 and "host-b" in lost[0].getMessage()
    shared = read_jsonl(steps_file(tmp_path, 0), [])
    assert shared and max(row["last_step"] for row in shared) < 20
    own = [p for p in (tmp_path / META_DIR).iterdir() if p.name.startswith("rank0.steps.")
           and p != steps_file(tmp_path, 0)]
    assert len(own) == 1 and f"-{os.getpid()}." in own[0].name
    assert parse_rank_file(own[0].name) is None  # the report never mixes it into the run
    rows = read_jsonl(own[0], [])
    assert rows and rows[-1]["last_step"] == 39  # summaries published after the takeover
    spans = sorted((row["first_step"], row["last_step"]) for row in shared + rows)
    assert all(a[1] + 1 == b[0] for a, b in zip(spans, spans[1:], strict=False))  # none twice
    assert not findings_file(tmp_path, 0).exists() or "after the takeover" not in \
        findings_file(tmp_path, 0).read_text()
    assert json.loads(marker.read_text())["token"] == other["token"]  # never removed at close
