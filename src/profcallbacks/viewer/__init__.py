"""``profcallbacks open``: one capture of a run opened in the Perfetto UI, in one command."""

from profcallbacks.viewer.choice import ChoiceError, choose_trace
from profcallbacks.viewer.perfetto import PERFETTO_ORIGIN, ServeError, perfetto_url, serve_once

__all__ = ["PERFETTO_ORIGIN", "ChoiceError", "ServeError", "choose_trace", "perfetto_url", "serve_once"]
