"""``check_determinism``: two loaders from one factory, compared batch by batch, bit for bit.

A loader whose worker threads drew from a random state every thread of the process shares is
reported with that state named (``loaderkit.workers.threadworkers.watch_shared_rngs``).

Examples:
    >>> bool(DeterminismReport(True, 1, 0, None))
    True
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import numpy as np
import torch

from loaderkit.order.hooks import call_hook
from loaderkit.plan import counted
from loaderkit.workers.threadworkers import watch_shared_rngs

__all__ = ["DeterminismReport", "check_determinism"]


def _leaves(obj: Any, path: str, out: list[tuple[str, str]]) -> None:
    """Flatten a batch into (path, digest) pairs."""
    if isinstance(obj, torch.Tensor):
        tensor = obj.detach().cpu().contiguous()
        digest = hashlib.blake2b(f"{tensor.dtype}{tuple(tensor.shape)}".encode(), digest_size=16)
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
        out.append((path, f"tensor {tensor.dtype} {tuple(tensor.shape)} {digest.hexdigest()}"))
    elif isinstance(obj, np.ndarray):
        array = np.ascontiguousarray(obj)
        digest = hashlib.blake2b(f"{array.dtype}{array.shape}".encode(), digest_size=16)
        if array.dtype.hasobject:
            digest.update(repr(array.tolist()).encode())
        else:
            digest.update(array.tobytes())
        out.append((path, f"ndarray {array.dtype} {array.shape} {digest.hexdigest()}"))
    elif isinstance(obj, Mapping):
        for key in sorted(obj, key=repr):
            _leaves(obj[key], f"{path}[{key!r}]", out)
    elif is_dataclass(obj) and not isinstance(obj, type):
        for f in fields(obj):
            _leaves(getattr(obj, f.name), f"{path}.{f.name}", out)
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            _leaves(item, f"{path}[{i}]", out)
    else:
        out.append((path, f"{type(obj).__name__} {obj!r}"))


@dataclass(frozen=True)
class DeterminismReport:
    """Result of ``check_determinism``.

    Attributes:
        deterministic: True when both loaders produced identical batches.
        epochs: Passes compared.
        batches: Batches compared.
        first_difference: ``None``, or where the loaders first differ (epoch, batch, path,
            and both values' fingerprints).

    Examples:
        >>> bool(DeterminismReport(True, 2, 10, None))
        True
    """

    deterministic: bool
    epochs: int
    batches: int
    first_difference: str | None

    def __bool__(self) -> bool:
        return self.deterministic

    def __str__(self) -> str:
        if self.deterministic:
            epochs = counted(self.epochs, "epoch")
            return f"deterministic: {self.batches} batches over {epochs} identical"
        return f"not deterministic: {self.first_difference}"


def _fingerprints(loader: Iterable[Any], epochs: int) -> Iterator[tuple[int, int, list]]:
    try:
        for epoch in range(epochs):
            for index, batch in enumerate(loader):
                leaves: list[tuple[str, str]] = []
                _leaves(batch, "batch", leaves)
                yield epoch, index, leaves
    finally:
        call_hook(loader, "close")


def _shared_note(draws: set[str]) -> str:
    """Why batches of worker threads that drew from process-wide RNGs are not reproducible."""
    return (
        f"the loader's worker threads drew from {', '.join(sorted(draws))}, which every "
        "thread of the process shares (the other workers and the training loop): the order "
        "of the draws depends on thread scheduling. Draw from loaderkit.worker_rng() (and "
        "torch.thread_safe_generator() for torch, where torch has it), or use "
        "worker_method='process'"
    )


def check_determinism(
    make_loader: Callable[[], Iterable[Any]], *, epochs: int = 2
) -> DeterminismReport:
    """Build two loaders with ``make_loader`` and compare their batches over ``epochs`` passes.

    Each batch is reduced to fingerprints of its leaves (tensors, arrays, scalars), so the
    comparison is exact (bit-for-bit) and cheap in memory. Loaders with a ``close()`` method are
    closed afterwards. A loader whose worker threads drew from a random state every thread
    shares (Python's ``random``, numpy's legacy global RNG, torch's default generator: see
    ``loaderkit.workers.threadworkers.watch_shared_rngs``) is reported not deterministic, naming
    it, even when both runs happened to match: the next run's thread schedule may differ.

    Args:
        make_loader: Zero-argument factory, e.g.
            ``lambda: create_dataloader(ds, shuffle=True, num_workers=2, seed=0)``.
        epochs: Passes over each loader.

    Returns:
        A ``DeterminismReport`` (truthy when identical) naming the first difference.

    Examples:
        >>> from loaderkit import create_dataloader
        >>> report = check_determinism(lambda: create_dataloader(list(range(8)), batch_size=4,
        ...                                                      shuffle=True, seed=0))
        >>> report.deterministic
        True
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    with watch_shared_rngs() as watched:
        first = list(_fingerprints(make_loader(), epochs))
        second = list(_fingerprints(make_loader(), epochs))
    draws = set(watched.names())
    for (epoch, index, a), (_, _, b) in zip(first, second, strict=False):
        if a != b:
            for (path_a, fa), (path_b, fb) in zip(a, b, strict=False):
                if (path_a, fa) != (path_b, fb):
                    where = path_a if path_a == path_b else f"{path_a} vs {path_b}"
                    detail = f"{where}: {fa} != {fb}"
                    break
            else:
                detail = f"batch has {len(a)} leaves in one run and {len(b)} in the other"
            if draws:
                detail += f"; {_shared_note(draws)}"
            return DeterminismReport(
                False, epochs, index, f"epoch {epoch}, batch {index}: {detail}"
            )
    if len(first) != len(second):
        return DeterminismReport(
            False,
            epochs,
            min(len(first), len(second)),
            f"the loaders yielded {len(first)} and {len(second)} batches",
        )
    if draws:  # identical this time, by the scheduler's chance
        return DeterminismReport(
            False, epochs, len(first), f"batches matched in both runs, but {_shared_note(draws)}"
        )
    return DeterminismReport(True, epochs, len(first), None)
