"""The current accelerator: ``torch.accelerator`` (torch 2.6+) or, before it, CUDA.

Checked on torch 2.4.1, 2.6.0, 2.9.1, 2.12.0, 2.13.0 and 2.14.1.

Examples:
    >>> accelerator_type() in (None, "cuda", "mps", "xpu", "mtia", "hpu")
    True
"""

from __future__ import annotations

from typing import Any, cast

import torch

__all__ = ["accelerator_type"]


def accelerator_type() -> str | None:
    """The device type of this process's accelerator (``"cuda"``, ``"mps"``...), or ``None``.

    torch 2.6 added ``torch.accelerator``; before it the answer is ``"cuda"`` when CUDA is
    available, ``"mps"`` on Apple silicon, else ``None``.
    """
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        current = cast(Any, accelerator).current_accelerator()
        return None if current is None else str(current.type)
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return None
