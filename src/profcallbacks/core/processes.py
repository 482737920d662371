"""Whether a process of this machine is alive, asked without signalling it.

Example:
    >>> import os
    >>> pid_alive(os.getpid())
    True
"""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (signal 0: nothing is sent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. EPERM: the process exists, owned by someone else
        return True
    return True
