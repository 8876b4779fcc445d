"""What torch sends to worker processes when the dataset is a DataPipe.

Checked on torch 2.4.1, 2.6.0, 2.9.1, 2.12.0, 2.13.0, 2.14.1 and 2.15.0.

torch's DataLoader wraps an ``IterDataPipe``/``MapDataPipe`` dataset in a serialization
wrapper (``_IterDataPipeSerializationWrapper``, ``_MapDataPipeSerializationWrapper``) that
pickles with ``dill`` where plain pickling fails. loaderkit's picklability check for
spawn/forkserver workers checks what torch will really send (``as_sent_to_workers``).

Examples:
    >>> as_sent_to_workers([1, 2]) == [1, 2]
    True
"""

from __future__ import annotations

from typing import Any

__all__ = ["as_sent_to_workers"]


def as_sent_to_workers(dataset: Any) -> Any:
    """``dataset`` as torch pickles it for its workers (DataPipes wrapped, anything else as is)."""
    try:
        from torch.utils.data.datapipes.datapipe import (
            IterDataPipe,
            MapDataPipe,
            _IterDataPipeSerializationWrapper,
            _MapDataPipeSerializationWrapper,
        )
    except ImportError:  # pragma: no cover - a torch without DataPipes
        return dataset
    if isinstance(dataset, IterDataPipe):
        return _IterDataPipeSerializationWrapper(dataset)
    if isinstance(dataset, MapDataPipe):
        return _MapDataPipeSerializationWrapper(dataset)
    return dataset
