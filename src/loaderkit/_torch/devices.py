"""Devices: the current accelerator (``torch.accelerator`` from 2.6, CUDA before), streams.

Checked on torch 2.4.1, 2.6.0, 2.9.1, 2.12.0, 2.13.0, 2.14.1 and 2.15.0.

``record_stream`` marks every block of a tensor's memory as used by a stream, sparse layouts
included (a COO tensor's indices and values are reached through its private ``_indices()`` and
``_values()``: the public ``indices()`` refuses an uncoalesced tensor).

Examples:
    >>> accelerator_type() in (None, "cuda", "mps", "xpu", "mtia", "hpu")
    True
"""

from __future__ import annotations

from typing import Any, cast

import torch

__all__ = ["accelerator_type", "record_stream"]


def accelerator_type() -> str | None:
    """The device type of this process's accelerator (``"cuda"``, ``"mps"``...), or ``None``.

    torch 2.6 added ``torch.accelerator``; before it the answer is ``"cuda"`` when CUDA is
    available, ``"mps"`` on Apple silicon, else ``None``.
    """
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        try:
            current = cast(Any, accelerator).current_accelerator()
        except RuntimeError:  # torch 2.6 raises where there is none (later ones give None)
            return None
        return None if current is None else str(current.type)
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return None


def record_stream(tensor: torch.Tensor, stream: Any) -> None:
    """``record_stream`` on the memory of ``tensor``, sparse layouts included."""
    layout = tensor.layout
    if layout == torch.strided:
        tensor.record_stream(stream)
    elif layout == torch.sparse_coo:
        tensor._indices().record_stream(stream)
        tensor._values().record_stream(stream)
    elif layout in (torch.sparse_csr, torch.sparse_bsr):
        for part in (tensor.crow_indices(), tensor.col_indices(), tensor.values()):
            part.record_stream(stream)
    elif layout in (torch.sparse_csc, torch.sparse_bsc):
        for part in (tensor.ccol_indices(), tensor.row_indices(), tensor.values()):
            part.record_stream(stream)
    # Other layouts (e.g. jagged) are still safe: the side stream waits for the consumer stream
    # before every copy, so released memory is not overwritten while queued work may read it.
