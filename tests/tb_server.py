"""A real TensorBoard server with the PyTorch profiler plugin, on 127.0.0.1, for tests."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PLUGIN = "/data/plugin/pytorch_profiler"


class TensorBoard:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path: str, **params: Any) -> Any:
        url = self.base + PLUGIN + path + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=30) as response:
            return json.loads(response.read())

    def wait_for_runs(self, expected: set[str], timeout_s: float = 120.0) -> list[str]:
        """Polls the plugin until it lists ``expected`` runs and has stopped loading."""
        deadline = time.monotonic() + timeout_s
        runs: dict[str, Any] = {}
        while time.monotonic() < deadline:
            with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
                runs = self.get("/runs")
                if expected <= set(runs["runs"]) and not runs["loading"]:
                    return list(runs["runs"])
            time.sleep(1.0)
        raise AssertionError(f"TensorBoard listed {runs} after {timeout_s}s, expected {expected}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def tensorboard(logdir: Path) -> Iterator[TensorBoard]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
         "--port", str(port), "--reload_interval", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        yield TensorBoard(port)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
