"""The texts of torch's DataLoader errors that loaderkit reads.

Checked on torch 2.4.1, 2.6.0, 2.9.1, 2.12.0, 2.13.0, 2.14.1 and 2.15.0.

When a worker dies, torch says so in one of a few ``RuntimeError`` texts: its ``SIGCHLD``
handler's "DataLoader worker (pid N) is killed by signal: Killed." or "... exited unexpectedly
with exit code N.", the liveness check's "DataLoader worker (pid(s) N) exited unexpectedly",
and "Pin memory thread exited unexpectedly". A worker's own exception is re-raised with
"Caught <type> in DataLoader worker process N". loaderkit reads these to name the dead worker's
signal and cause (``loaderkit.workers.deaths``); if torch reworded them, loaderkit would leave
torch's error as it is (nothing is lost, only the extra explanation).

Examples:
    >>> deaths_named("DataLoader worker (pid 77) is killed by signal: Killed. ")
    [(77, -9)]
"""

from __future__ import annotations

import re
import signal

__all__ = ["deaths_named", "is_worker_exception", "may_be_worker_death"]

#: ``strsignal`` text (what torch's ``SIGCHLD`` handler prints) -> signal number.
_SIGNAL_TEXTS = {
    text: int(number) for number in signal.Signals if (text := signal.strsignal(number)) is not None
}
_DEATH = re.compile(
    r"DataLoader worker \(pid (\d+)\) (?:is killed by signal: ([^.]+)\.|"
    r"exited unexpectedly with exit code (-?\d+))"
)


def is_worker_exception(text: str) -> bool:
    """Whether ``text`` is a worker's own exception as torch re-raises it.

    Examples:
        >>> is_worker_exception("Caught OSError in DataLoader worker process 0.")
        True
    """
    return "in DataLoader worker process" in text


def may_be_worker_death(text: str) -> bool:
    """Whether a ``RuntimeError`` with ``text`` is how torch reports a dead worker.

    Examples:
        >>> may_be_worker_death("DataLoader worker (pid 7) is killed by signal: Killed.")
        True
        >>> may_be_worker_death("CUDA error")
        False
    """
    if "Pin memory thread exited unexpectedly" in text:  # it died reading a dead worker's queue
        return True
    return "DataLoader worker (pid" in text and (
        "exited unexpectedly" in text or "killed by signal" in text
    )


def deaths_named(text: str) -> list[tuple[int, int]]:
    """``(pid, exitcode)`` of each death torch's ``SIGCHLD`` handler reported in ``text``.

    A negative exit code is the signal that killed the worker, as ``Process.exitcode`` gives.

    Examples:
        >>> deaths_named("DataLoader worker (pid 5) exited unexpectedly with exit code 3.")
        [(5, 3)]
    """
    deaths = []
    for match in _DEATH.finditer(text):
        pid, signal_text, code = match.groups()
        if code is not None:
            deaths.append((int(pid), int(code)))
        elif signal_text in _SIGNAL_TEXTS:
            deaths.append((int(pid), -_SIGNAL_TEXTS[signal_text]))
    return deaths
