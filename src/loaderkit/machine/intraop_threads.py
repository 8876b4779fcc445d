"""Torch's intra-op threads in the training process while a pass of a loader's workers runs.

On a host with fewer usable CPUs than torch's intra-op threads plus a loader's workers, the
training process's OpenMP threads (every CPU op of torch: a reduction, a copy, a model's forward
on the CPU) spin-wait after each parallel region and take the CPU the workers need to read the
next batches; lowering the training process's threads while the workers run gives that CPU
back (``docs/handoff.md`` has the measurements, from ``benchmarks/handoff.py``).

The decision is ``loaderkit.policy.resolve_main_threads`` (a pure function of ``PlatformInfo``);
this module reads torch's thread count (``torch_threads``) and lowers it for the duration of a
pass (``ThreadLimit``), putting back what it found when the pass ends.

Examples:
    >>> limit = ThreadLimit(1)
    >>> before = torch.get_num_threads()
    >>> limit.lower(); torch.get_num_threads()
    1
    >>> limit.restore(); torch.get_num_threads() == before
    True
"""

from __future__ import annotations

import os
import threading

import torch

__all__ = ["THREAD_ENV", "ThreadLimit", "torch_threads"]

#: Environment variables through which a user sets the intra-op threads of torch's backends.
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")

#: torch's own count, read when loaderkit is imported (before a script usually changes it).
_TORCH_DEFAULT = torch.get_num_threads()

_LOCK = threading.Lock()


def torch_threads() -> tuple[int, bool]:
    """Torch's intra-op threads in this process, and whether the user chose that number.

    The number counts as chosen when one of ``THREAD_ENV`` is set, or when it differs from
    the count torch had when loaderkit was imported (``torch.set_num_threads`` was called).

    Example:
        >>> threads, chosen = torch_threads()
        >>> threads == torch.get_num_threads()
        True
    """
    threads = torch.get_num_threads()
    chosen = any(os.environ.get(name) for name in THREAD_ENV) or threads != _TORCH_DEFAULT
    return threads, chosen


class ThreadLimit:
    """Lowers torch's intra-op threads to ``limit`` for a pass and puts them back after it.

    ``restore`` sets back the count ``lower`` found, unless something else changed it in
    between (then that change is kept). Both are idempotent; ``limit=None`` does nothing.

    Args:
        limit: The thread count during a pass (``None``: leave torch's threads alone).
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._previous: int | None = None

    def lower(self) -> None:
        """Lower torch's threads to ``limit`` if they are above it (start of a pass)."""
        limit = self.limit
        if limit is None or self._previous is not None:
            return
        with _LOCK:
            current = torch.get_num_threads()
            if current > limit:
                self._previous = current
                torch.set_num_threads(limit)

    def restore(self) -> None:
        """Put back the count ``lower`` found (end of a pass, shutdown)."""
        previous, self._previous = self._previous, None
        if previous is None:
            return
        with _LOCK:
            if torch.get_num_threads() == self.limit:
                torch.set_num_threads(previous)
