"""Real file-system faults for tests: a small tmpfs that can fill up or turn read-only."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


class SmallDisk:
    """A tmpfs of ``size`` bytes mounted by the test (root only)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._filler = root / ".filler"

    def fill(self) -> None:
        """Write until the disk is full (the next write of any size gets ENOSPC)."""
        fd = os.open(self._filler, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            for size in (64 << 10, 1):
                with contextlib.suppress(OSError):
                    while True:
                        os.write(fd, b"\0" * size)
        finally:
            os.close(fd)
        probe = self.root / ".probe"
        with pytest.raises(OSError) as info, open(probe, "wb") as f:
            f.write(b"x")
        probe.unlink(missing_ok=True)
        assert info.value.errno == errno.ENOSPC

    def free(self) -> None:
        self._filler.unlink(missing_ok=True)

    def read_only(self, on: bool) -> None:
        subprocess.run(["mount", "-o", "remount," + ("ro" if on else "rw"), str(self.root)],
                       check=True)


@pytest.fixture(name="small_disk")
def small_disk_fixture() -> Iterator[SmallDisk]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI and the dev container run tests as root)")
    root = Path(tempfile.mkdtemp(prefix="profcallbacks-tmpfs-"))
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(root)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        root.rmdir()
        pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip()})")
    try:
        yield SmallDisk(root)
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)
        root.rmdir()


def small_run(logdir: Path, steps: int, **options: object) -> Path:
    """A short plain-loop run: one capture of steps 2-3, a steps-file row every 5 steps, no
    detectors; ``options`` go to the profiler. Returns ``logdir``."""
    from helpers import tiny_model, train_step
    from profcallbacks import Schedule, StepProfiler

    model, opt = tiny_model()
    with StepProfiler(logdir, schedule=Schedule(skip_first=2, warmup=0, active=2, repeat=1),
                      log_every_n_steps=5, stall=None, slowdown=None, sync_audit=False,
                      **options) as prof:  # type: ignore[arg-type]
        for _ in range(steps):
            train_step(model, opt)
            prof.step()
    return logdir


def copied_run(run: Path, tmp_path: Path) -> Path:
    """A copy of ``run`` the test may spoil (the module's run is made once)."""
    logdir = tmp_path / "run"
    shutil.copytree(run, logdir)
    return logdir
