"""Serves one trace to the Perfetto UI, once, from the loopback interface.

The Perfetto UI (https://ui.perfetto.dev) runs in the browser and fetches a trace from a URL given
after ``#!/?url=``; it may read from ``http://127.0.0.1`` when the answer carries
``Access-Control-Allow-Origin: https://ui.perfetto.dev`` (the way Perfetto's own
``open_trace_in_ui`` serves a file). The server answers that one file, nothing else, and stops once
it has been fetched whole. The UI itself needs the internet; offline, the HTML report is the
viewer (``profcallbacks report --format html``).

Example:
    >>> perfetto_url("all-ranks.120.trace.json.gz", 9001)
    'https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/all-ranks.120.trace.json.gz'
"""

from __future__ import annotations

import errno
import http.server
import webbrowser
from pathlib import Path
from typing import TextIO
from urllib.parse import quote

from profcallbacks.core.safefs import read_regular
from profcallbacks.report.render.safe import visible

PERFETTO_ORIGIN = "https://ui.perfetto.dev"
DEFAULT_PORT = 9001
"""The port Perfetto's own ``open_trace_in_ui`` uses."""
MAX_TRACE_BYTES = 2 << 30
"""Largest file served (the UI loads traces of this size at the most)."""


class ServeError(Exception):
    """The trace cannot be served (unreadable, or the port is taken); ``str()`` says what to do."""


def perfetto_url(name: str, port: int) -> str:
    """The Perfetto UI address that opens ``http://127.0.0.1:<port>/<name>``."""
    return f"{PERFETTO_ORIGIN}/#!/?url=http://127.0.0.1:{port}/{quote(name)}"


def serve_once(trace: Path, *, port: int = DEFAULT_PORT, browser: bool = True,
               out: TextIO, poll_s: float = 0.5) -> int:
    """Serves ``trace`` until the UI has fetched it once (or Ctrl-C); the exit status.

    Args:
        trace: The file to serve (read once, never through a link).
        port: The loopback port to serve from.
        browser: Open the Perfetto UI in the default browser.
        out: Where the URL and the outcome are written.
        poll_s: Seconds between checks for Ctrl-C while waiting.

    Returns:
        0 once the trace was fetched or on Ctrl-C.

    Raises:
        ServeError: The file cannot be read or the port is taken.
    """
    try:
        body = read_regular(trace, max_bytes=MAX_TRACE_BYTES, follow=True)
    except OSError as exc:
        raise ServeError(f"cannot read {trace} ({exc.strerror or exc})") from None
    name = trace.name
    handler = _one_file_handler(f"/{quote(name)}", body)
    try:
        server = http.server.HTTPServer(("127.0.0.1", port), handler)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ServeError(f"port {port} on 127.0.0.1 is in use (another `profcallbacks open` or "
                             "trace server?); stop it or choose another with --port N") from None
        raise ServeError(f"cannot serve on 127.0.0.1:{port} ({exc.strerror or exc})") from None
    url = perfetto_url(name, server.server_address[1])
    out.write(f"Serving {visible(str(trace))} ({len(body) / 1e6:.1f} MB) once at "
              f"http://127.0.0.1:{server.server_address[1]}/{quote(name)}\n"
              f"Open it in Perfetto (needs the internet; Ctrl-C to stop):\n  {url}\n")
    out.flush()
    if browser:
        webbrowser.open(url)
    server.timeout = poll_s
    try:
        with server:
            while not handler.fetched:
                server.handle_request()
    except KeyboardInterrupt:
        out.write("profcallbacks: stopped before the trace was fetched\n")
        return 0
    out.write("The trace was fetched; the server has stopped.\n")
    return 0


class _OneFile(http.server.BaseHTTPRequestHandler):
    path_served = "/"
    body = b""
    fetched = False

    def _headers(self, status: int, length: int) -> None:
        self.send_response(status)
        self.send_header("Access-Control-Allow-Origin", PERFETTO_ORIGIN)
        self.send_header("Access-Control-Allow-Methods", "GET, HEAD, OPTIONS")
        self.send_header("Access-Control-Allow-Headers", "*")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.end_headers()

    def do_OPTIONS(self) -> None:  # noqa: N802 - the CORS preflight
        self._headers(204, 0)

    def do_HEAD(self) -> None:  # noqa: N802
        ok = self.path == self.path_served
        self._headers(200 if ok else 404, len(self.body) if ok else 0)

    def do_GET(self) -> None:  # noqa: N802
        if self.path != self.path_served:
            self._headers(404, 0)
            return
        self._headers(200, len(self.body))
        self.wfile.write(self.body)
        self.wfile.flush()
        type(self).fetched = True

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
        pass


def _one_file_handler(path: str, body: bytes) -> type[_OneFile]:
    return type("OneFileHandler", (_OneFile,), {"path_served": path, "body": body, "fetched": False})
