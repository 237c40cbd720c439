"""One background thread per process that answers the node ledger's trim requests of pools that
sit idle (a busy pool answers at its next execution), within TRIM_POLL_S. Process-wide state,
changed only through `watch` and `unwatch`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

TRIM_POLL_S = 0.05

Answer = Callable[[], object]  # e.g. MemoryPool.answer_trim, or an instance's own
_answers: list[Answer] = []
_lock = threading.Lock()
_thread: threading.Thread | None = None


def watch(answer: Answer) -> None:
    """Call `answer` every TRIM_POLL_S from the background until `unwatch(answer)`; it must be
    cheap when nobody asked for memory."""
    global _thread
    with _lock:
        _answers.append(answer)
        if _thread is None:
            _thread = threading.Thread(target=_run, name="tidepool-trim-watch", daemon=True)
            _thread.start()


def unwatch(answer: Answer) -> None:
    with _lock:
        if answer in _answers:
            _answers.remove(answer)


def _run() -> None:
    while True:
        with _lock:
            answers = list(_answers)
        for answer in answers:
            try:
                answer()
            except Exception:  # noqa: S112 - a pool closing meanwhile; it is unwatched next
                continue
        time.sleep(TRIM_POLL_S)
