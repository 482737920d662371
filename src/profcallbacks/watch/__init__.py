"""``profcallbacks watch``: a live terminal view of a log directory, read from its files only."""

from profcallbacks.watch.app import WatchOptions, watch
from profcallbacks.watch.state import LogdirState
from profcallbacks.watch.tail import JsonlTail

__all__ = ["JsonlTail", "LogdirState", "WatchOptions", "watch"]
