"""torch's ``SIGCHLD`` handler, wrapped so the error it raises can be explained.

Checked on torch 2.4.1, 2.6.0, 2.9.1, 2.12.0, 2.13.0, 2.14.1 and 2.15.0.

A worker-process iterator installs one ``SIGCHLD`` handler per process
(``_utils.signal_handling._set_SIGCHLD_handler``); when a worker dies it raises a
``RuntimeError`` ("DataLoader worker (pid N) is killed by signal: ...") wherever the main thread
is. ``wrap_worker_signal_handler`` wraps whatever handler is installed, once, so that error is
passed through ``translate`` first (same type, chained). Main thread only, as signal handlers
must be.

Examples:
    >>> wrap_worker_signal_handler(lambda error: None)  # no handler installed yet: nothing
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["wrap_worker_signal_handler"]


def wrap_worker_signal_handler(translate: Callable[[RuntimeError], RuntimeError | None]) -> None:
    """Wrap the current ``SIGCHLD`` handler so its ``RuntimeError`` goes through ``translate``.

    Args:
        translate: Returns the error to raise instead (``None``: raise torch's as it is).
    """
    if not hasattr(signal, "SIGCHLD") or threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGCHLD)
    if not callable(current) or getattr(current, "_loaderkit_wrapper", False):
        return

    def handler(signum: int, frame: Any) -> None:
        try:
            current(signum, frame)
        except RuntimeError as error:
            translated = translate(error)
            if translated is None:
                raise
            raise translated from error

    handler._loaderkit_wrapper = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGCHLD, handler)
