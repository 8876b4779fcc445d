"""Whether CUDA is usable in this process: torch's own bad-fork check.

Checked on torch 2.4.1, 2.6.0, 2.9.1, 2.12.0, 2.13.0, 2.14.1 and 2.15.0.

A process forked after its parent initialised CUDA cannot use CUDA (torch raises "Cannot
re-initialize CUDA in forked subprocess"); torch records that in
``torch.cuda._is_in_bad_fork()``. Without it (a torch that dropped the helper) the answer is
``False``: CUDA counts as usable, and torch's own error still names the problem.

Examples:
    >>> in_bad_fork()
    False
"""

from __future__ import annotations

import torch

__all__ = ["in_bad_fork"]


def in_bad_fork() -> bool:
    """Whether this process was forked after its parent initialised CUDA."""
    check = getattr(torch.cuda, "_is_in_bad_fork", None)
    if not callable(check):  # pragma: no cover - a torch without the check
        return False
    try:
        return bool(check())
    except Exception:  # pragma: no cover - never let detection fail on a private helper
        return False
