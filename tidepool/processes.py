"""Per-process files and their owners, shared by the launcher (which removes what dead processes
left) and the runtime (whose instances share a file per server): where such files live, and
whether the process that owns one still runs."""

from __future__ import annotations

import os
from pathlib import Path

SHM_DIRECTORY = Path("/dev/shm")


def shared_directory(preferred: Path = SHM_DIRECTORY) -> Path:
    """Where a server's shared files go: /dev/shm (memory), or /tmp on a system without it."""
    return preferred if preferred.is_dir() else Path("/tmp")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user
        return True
    return True
