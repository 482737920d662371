"""The export helper: a process of its own that writes captures while training goes on.

The training process stops the profiler and lets kineto save its raw trace (what torch's own
``on_trace_ready`` export costs too), then hands the file to a helper process, started on the
start of the run (on ranks that write traces), at the lowest CPU priority. There
:class:`~profcallbacks.capture.trace_writer.CaptureWriter` parses, post-processes, gzips and publishes
it without holding the training process's GIL. The helper
reads jobs from its stdin: when the run closes, or the training process dies, it sees the end of
the pipe, finishes what it has and exits, so it never outlives the run. Messages are pickles;
results come back on a pipe of their own (not stdout, where a site's ``sitecustomize`` banner
or a library's print would land), and the helper's stdout and stderr are the job's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from profcallbacks.capture.claims import StagingClaim
from profcallbacks.capture.published import AfterPublish
from profcallbacks.capture.trace_writer import (
    RAW_FILE,
    CaptureHook,
    CaptureWriter,
    new_raw_trace_path,
    remove_raw,
    rescue_raw,
)
from profcallbacks.core.capture_info import CaptureInfo
from profcallbacks.core.faults import describe_error
from profcallbacks.findings import Finding
from profcallbacks.layout import STAGING_DIR
from profcallbacks.options.budget import ByteBudget

log = logging.getLogger(__name__)

USE_HELPER_PROCESS = True
"""False: write captures on a thread of the training process instead (tests, no ``fork``)."""
CLOSE_BYTES_PER_S = 2e6
"""At close, the wait for the helper grows by one second per this many raw trace bytes queued."""
PUBLISH_WAIT_S = 30.0
"""At close, how long the helper waits for another rank's file of a capture while no live rank
owes it one (that rank never started, or was killed) before publishing it as partial."""
OWED_WAIT_S = 120.0
"""The same wait while another live rank owes the capture a file (its window is open or its file
is being written): a guard against a rank that hangs."""

Message = tuple[Any, ...]

_BOOT = ("import sys, types; m = types.ModuleType('profcallbacks'); m.__path__ = [sys.argv[1]]; "
         "sys.modules['profcallbacks'] = m; "  # this very package, wherever the child's sys.path points
         "from profcallbacks.capture.exporter import main; main()")


class TraceExporter:
    """Saves each stopped profiler's raw trace and has the helper process write it.

    Example:
        >>> import os, torch
        >>> from profcallbacks.core.ranks import RankInfo
        >>> exporter = TraceExporter(getfixture("tmp_path"))
        >>> with torch.profiler.profile() as stopped:
        ...     _ = torch.ones(2) * 2
        >>> info = CaptureInfo("step000000-manual", "manual", 0, (), False, os.getpid(), 0,
        ...                    RankInfo())
        >>> raw, size = exporter.save(stopped, info)  # kineto's save, on this thread
        >>> exporter.queue(raw, size, info); exporter.close()  # the rest in the helper
        >>> [path.name for path in exporter.exported]
        ['step000000-manual']
    """

    def __init__(self, logdir: Path, *, tracing_ranks: int = 1,
                 publish_timeout_s: float = PUBLISH_WAIT_S, analysis: CaptureHook | None = None,
                 budget: ByteBudget | None = None):
        self._logdir = logdir
        self._claim = StagingClaim(logdir)  # its raw traces are a live rank's
        self._config: Message = ("config", str(logdir), tracing_ranks, publish_timeout_s, analysis,
                                 budget, self._claim.token)
        self._publish_timeout_s = publish_timeout_s
        self._owed_timeout_s = OWED_WAIT_S
        self._alone = tracing_ranks <= 1  # no other rank's file to wait for at close
        self._channel: _Channel | None = None
        self._lock = threading.Lock()  # _jobs, _findings, exported: the reader thread writes them
        self._jobs: dict[str, tuple[CaptureInfo, int, Path]] = {}  # name -> info, bytes, raw file
        self._orphans: list[tuple[CaptureInfo, Path]] = []  # sent to a helper that died
        self._findings: list[Finding] = []
        self.exported: list[Path] = []
        self.failures = 0

    @property
    def busy(self) -> bool:
        """An export is queued or running."""
        return bool(self._jobs)

    @property
    def in_process(self) -> bool:
        """Exports run on a thread of this process (no helper process could be started)."""
        return self._channel is not None and self._channel.in_process

    @property
    def helper_pid(self) -> int | None:
        """Process id of the helper while it runs (``None``: not started, gone, or a thread)."""
        return self._channel.pid if self._channel is not None else None

    def prepare(self) -> None:
        """Start the helper now (a window begins), not when its first export is due.

        A helper that died (killed, out of memory) is replaced; the traces it never wrote are
        published raw as ``-partial`` at close.
        """
        if self._channel is not None and self._channel.gone:
            log.warning("profcallbacks: the export helper stopped; a new one is started.")
            with self._lock:
                self._orphans += [(info, raw) for info, _, raw in self._jobs.values()]
                self._jobs.clear()
            self._channel = None
        if self._channel is None:
            self._channel = _start_channel(self._on_message)
            self._channel.send(self._config)

    def owe(self, capture: str) -> None:
        """A window of ``capture`` opened here: other ranks publishing it wait for this rank's
        file (until it is written, or ``paid`` says it never will be); never raises."""
        try:
            self._claim.owe(capture)
        except OSError as exc:  # staging refused: the others only wait less
            log.debug("profcallbacks: cannot claim %s (%s).", capture, exc)

    def paid(self, capture: str) -> None:
        """This rank writes no (further) file of ``capture``; never raises."""
        self._claim.paid(capture)

    def save(self, profiler: Any, info: CaptureInfo) -> tuple[Path, int] | None:
        """Save ``profiler``'s raw trace for ``info`` here (kineto's save: on this thread);
        returns its path and size in bytes, or ``None`` when it could not be saved (logged)."""
        raw: Path | None = None
        try:
            raw = new_raw_trace_path(self._logdir, info, self._claim)  # a private directory: kineto
            with _kineto_path(raw) as target:  # kineto saves by path; it stays with the profiler
                profiler.export_chrome_trace(target)
            return raw, os.lstat(raw).st_size
        except Exception as exc:
            self.failures += 1
            log.warning("profcallbacks: could not export capture %s (%s); training "
                        "continues and later captures are still tried.",
                        info.name, describe_error(exc, self._logdir))
            if raw is not None:
                remove_raw(raw)
            return None

    def queue(self, raw: Path, size: int, info: CaptureInfo) -> None:
        """Hand the saved raw trace ``raw`` (and the pieces ``info`` names) to the helper."""
        self.prepare()
        assert self._channel is not None
        with self._lock:
            self._jobs[info.name] = (info, size, raw)
        self._channel.send(("export", str(raw), info))

    def take_findings(self) -> list[Finding]:
        """Findings about published captures since the last call (for the training thread)."""
        if not self._findings:
            return []
        with self._lock:
            findings, self._findings = self._findings, []
        return findings

    def close(self, timeout_s: float = 120.0, publish_timeout_s: float | None = None,
              owed_timeout_s: float | None = None) -> None:
        """Finish the exports: wait ``timeout_s`` plus time for the queued trace bytes.

        A helper that does not finish in time is stopped, and each trace it did not write is
        published raw (not post-processed, not compressed) in a ``-partial`` directory.
        ``publish_timeout_s`` and ``owed_timeout_s`` override how long the helper waits for
        other ranks' files (see :class:`CaptureWriter`; after a failure: no wait for a rank
        that owes nothing, a short one for the files live ranks still write).
        """
        if publish_timeout_s is not None:
            self._publish_timeout_s = publish_timeout_s
        if owed_timeout_s is not None:
            self._owed_timeout_s = owed_timeout_s
        channel, self._channel = self._channel, None
        try:
            if channel is not None:
                self._finish(channel, timeout_s)
        finally:
            self._claim.release()  # every raw trace is written, rescued or removed

    def _finish(self, channel: _Channel, timeout_s: float) -> None:
        with self._lock:
            queued = sum(size for _, size, _ in self._jobs.values())
        waits = (self._publish_timeout_s, self._owed_timeout_s)
        limit = timeout_s + (0.0 if self._alone else max(waits)) + queued / CLOSE_BYTES_PER_S
        channel.send(("close", *waits))
        if not channel.wait(limit):
            log.warning("profcallbacks: trace export still running after %.0f s; it is stopped "
                        "and unfinished captures are published raw as -partial.", limit)
            channel.kill()
        with self._lock:
            unwritten = self._orphans + [(info, raw) for info, _, raw in self._jobs.values()]
            self._jobs.clear()
            self._orphans = []
        for info, raw in unwritten:
            try:
                rescued = rescue_raw(self._logdir, info, raw)
            except OSError as exc:  # e.g. the disk is full: the run still ends cleanly
                log.warning("profcallbacks: could not publish the raw trace of %s (%s).",
                            info.name, describe_error(exc, self._logdir))
                continue
            if rescued is not None:
                self.exported.append(rescued)

    def _on_message(self, message: Message) -> None:
        """A message from the helper (on the channel's reader thread)."""
        kind = message[0]
        if kind == "log":
            log.log(message[1], "%s", message[2])
        elif kind in ("done", "closed"):
            with self._lock:
                self.exported.extend(Path(p) for p in message[1])
                self._findings = self._findings + list(message[2])
                self.failures += message[3]
                if kind == "done":
                    self._jobs.pop(message[4], None)
            if kind == "done":  # written, or failed: owed no longer
                self._claim.paid(message[4])


@contextlib.contextmanager
def _kineto_path(raw: Path) -> Iterator[str]:
    """A path kineto can save ``raw`` to: kineto drops line breaks from the path it renames its
    temporary file to, so a log directory named with one is reached through a link of our own,
    in a private temporary directory (mode 0700: nobody else can swap it), to the absolute path
    (a relative one would be read from the temporary directory)."""
    if not any(c in str(raw) for c in "\r\n"):
        yield str(raw)
        return
    alias = Path(tempfile.mkdtemp(prefix="profcallbacks-"))
    try:
        (alias / "d").symlink_to(raw.parent.absolute(), target_is_directory=True)
        yield str(alias / "d" / raw.name)
    finally:
        with contextlib.suppress(OSError):
            (alias / "d").unlink()
            alias.rmdir()


class _Channel:
    """The helper process, or (``USE_HELPER_PROCESS = False``) a thread doing its work."""

    def __init__(self, on_message: Callable[[Message], None]) -> None:
        self._on_message = on_message
        self._done = threading.Event()
        self._process: subprocess.Popen[bytes] | None = None
        self._inbox: list[Message] = []
        self._ready = threading.Condition()
        self._results: IO[bytes] | None = None

    def start_process(self) -> None:
        package = str(Path(__file__).resolve().parent.parent)
        results, child_end = os.pipe()  # the helper's results only: its stdout is the job's
        try:
            self._process = subprocess.Popen(  # its own session: Ctrl-C stops training, not it
                [sys.executable, "-c", _BOOT, package, str(child_end)], stdin=subprocess.PIPE,
                pass_fds=(child_end,), close_fds=True, start_new_session=True)
        except BaseException:
            os.close(results)
            raise
        finally:
            os.close(child_end)
        self._results = os.fdopen(results, "rb")
        threading.Thread(target=self._read, name="profcallbacks-export-reader",
                         daemon=True).start()

    @property
    def in_process(self) -> bool:
        return self._process is None

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def gone(self) -> bool:
        """The helper ended before it was asked to (its pipe broke, or it exited)."""
        return self._done.is_set()

    def start_thread(self) -> None:
        threading.Thread(target=self._serve_here, name="profcallbacks-export", daemon=True).start()

    def send(self, message: Message) -> None:
        if self._process is not None:
            assert self._process.stdin is not None
            try:
                pickle.dump(message, self._process.stdin)
                self._process.stdin.flush()
            except (BrokenPipeError, OSError) as exc:
                log.warning("profcallbacks: the export helper is gone (%s).", exc)
                self._done.set()
        else:
            with self._ready:
                self._inbox.append(message)
                self._ready.notify()

    def wait(self, timeout_s: float) -> bool:
        done = self._done.wait(timeout_s)
        if done and self._process is not None:
            try:
                self._process.wait(5.0)
            except subprocess.TimeoutExpired:
                self.kill()
            self._close_pipes()
        return done

    def kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._close_pipes()

    def _close_pipes(self) -> None:
        """Close the job pipe; the results pipe is closed by its reader thread when it ends."""
        if self._process is not None and self._process.stdin is not None:
            with contextlib.suppress(OSError):
                self._process.stdin.close()

    def _read(self) -> None:
        assert self._results is not None
        out = self._results
        try:
            while True:
                message = pickle.load(out)
                self._on_message(message)
                if message[0] == "closed":
                    break
        except (EOFError, OSError, pickle.UnpicklingError):
            pass
        finally:
            with contextlib.suppress(OSError):
                out.close()
            self._done.set()

    def _receive_here(self) -> Message | None:
        with self._ready:
            while not self._inbox:
                self._ready.wait()
            return self._inbox.pop(0)

    def _serve_here(self) -> None:
        try:
            serve(self._receive_here, self._on_message)
        finally:
            self._done.set()


def _start_channel(on_message: Callable[[Message], None]) -> _Channel:
    channel = _Channel(on_message)
    if USE_HELPER_PROCESS:
        try:
            channel.start_process()
            return channel
        except OSError as exc:
            log.warning("profcallbacks: cannot start the export helper process (%s); captures "
                        "are written on a thread, which slows training more.", exc)
    channel.start_thread()
    return channel


def serve(receive: Callable[[], Message | None], reply: Callable[[Message], None]) -> None:
    """The helper's loop: ``config``, then ``export`` jobs, until ``close`` or the end.

    The config message carries the live capture analysis (a module-level function: pickled by
    its name, imported again in the helper process).
    """
    writer: CaptureWriter | None = None
    logdir: Path | None = None
    training: StagingClaim | None = None  # the training process's claim
    owing: StagingClaim | None = None  # the files this helper is writing
    closed = False

    def report(kind: str, *extra: Any) -> None:
        assert writer is not None
        exported, writer.exported = writer.exported, []
        findings, writer.findings = writer.findings, []
        failures, writer.failures = writer.failures, 0
        reply((kind, [str(p) for p in exported], findings, failures, *extra))

    while (message := receive()) is not None:
        kind = message[0]
        if kind == "config":
            analysis: CaptureHook | None = message[4]
            budget: ByteBudget | None = message[5]
            logdir = Path(message[1])
            training, owing = StagingClaim(logdir, token=message[6]), StagingClaim(logdir)
            writer = CaptureWriter(logdir, tracing_ranks=message[2],
                                   publish_timeout_s=message[3], owed_timeout_s=OWED_WAIT_S,
                                   after_publish=AfterPublish(
                                       logdir, budget) if budget is not None else None,
                                   on_published=analysis)
            writer.own_claims = (training.token, owing.token)  # this rank's: never waited for
        elif kind == "export" and writer is not None and owing is not None:
            info: CaptureInfo = message[2]
            with contextlib.suppress(OSError):  # owed while written, the training process gone too
                owing.owe(info.name)
            writer.export(Path(message[1]), info)
            owing.paid(info.name)
            report("done", info.name)
        elif kind == "close":
            if writer is not None and len(message) > 2:
                writer.publish_timeout_s, writer.owed_timeout_s = message[1], message[2]
            closed = True
            break
    if writer is not None:  # closed, or the training process is gone: publish what is here
        writer.close()
        report("closed")
    if owing is not None and training is not None and logdir is not None:
        owing.release()
        _release_training(logdir, training, gone=not closed)


def _release_training(logdir: Path, claim: StagingClaim, *, gone: bool) -> None:
    """Everything the training process's claim covers is written, published or discarded: the
    claim goes (the training process may have been stopped before it could remove it). When the
    training process is ``gone`` (killed in a window), the raw saves it never handed over (the
    first step of a window saved on its own) go too: nobody can finish them."""
    if gone:
        staging = logdir / STAGING_DIR
        with contextlib.suppress(OSError):
            for name in os.listdir(staging):
                if name.startswith(claim.raw_prefix):
                    remove_raw(staging / name / RAW_FILE)
    claim.release()


class _LogForwarder(logging.Handler):
    """Sends the helper's log records to the training process, which logs them."""

    def __init__(self, reply: Callable[[Message], None]) -> None:
        super().__init__(logging.INFO)
        self._reply = reply

    def emit(self, record: logging.LogRecord) -> None:
        self._reply(("log", record.levelno, record.getMessage()))


def main() -> None:
    """Entry point of the helper process (stdin: jobs; results on the pipe named by argv[2])."""
    with contextlib.suppress(OSError, AttributeError):
        os.nice(19)  # idle CPU only: on a busy machine training keeps the cores it had
    source: IO[bytes] = sys.stdin.buffer
    sink: IO[bytes] = os.fdopen(int(sys.argv[2]), "wb")

    def receive() -> Message | None:
        try:
            message: Message = pickle.load(source)
            return message
        except (EOFError, OSError, pickle.UnpicklingError):
            return None

    def reply(message: Message) -> None:
        try:
            pickle.dump(message, sink)
            sink.flush()
        except (BrokenPipeError, OSError):
            pass

    root = logging.getLogger("profcallbacks")
    root.addHandler(_LogForwarder(reply))
    root.setLevel(logging.INFO)
    root.propagate = False
    serve(receive, reply)
