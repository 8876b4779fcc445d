"""How well an order mixes: the mean per-batch entropy of a label over the corpus's own.

A batch drawn from a full shuffle holds the labels (the file a sample comes from, a plate, a
drug, a cell type) about as the whole corpus does; a batch read in file order holds one. The
measure annbatch's paper and scDataset use for this is the Shannon entropy of a label within
each batch, averaged over the batches, here divided by the entropy of the label over all
samples of the order: about 1 for a full shuffle (a little below: a batch is a finite draw),
0 for file order, in between for orders that read blocks of consecutive rows. It needs the
index stream only, never a sample's data.

Example:
    >>> import numpy as np
    >>> files = np.repeat(np.arange(4), 100)  # 4 files of 100 samples, in file order
    >>> batch_mix(files, 50)
    0.0
    >>> round(batch_mix(files[np.random.default_rng(0).permutation(400)], 50), 2)
    0.98
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from loaderkit.errors import ConfigError, check_int
from loaderkit.support import answers, support_of

__all__ = ["batch_mix", "order_mix", "shuffle_mix"]


def _entropy(counts: np.ndarray) -> np.ndarray:
    """Shannon entropy (nats) of each row of ``counts`` (a row of zeros: 0)."""
    totals = counts.sum(axis=-1, keepdims=True)
    p = np.divide(counts, totals, out=np.zeros(counts.shape), where=totals > 0)
    logs = np.log(p, out=np.zeros(p.shape), where=p > 0)
    return np.asarray(-(p * logs).sum(axis=-1))


def batch_mix(labels: Sequence[Any] | np.ndarray, batch_size: int) -> float:
    """The mean per-batch entropy of ``labels`` (in the order read) over their entropy in all.

    Args:
        labels: Each sample's label, in the order a loader reads the samples (any hashable
            values; integers are used as they are).
        batch_size: Samples a batch; the last, partial batch counts as a batch.

    Returns:
        The ratio, in ``[0, 1]`` up to rounding: 1 where every batch holds the labels as the
        whole order does, 0 where each holds one label. 1.0 where there is one label or none
        (nothing to mix).

    Raises:
        ConfigError: ``batch_size`` is not a positive integer.

    Example:
        >>> batch_mix([0, 0, 1, 1], 2), batch_mix([0, 1, 0, 1], 2)
        (0.0, 1.0)
    """
    batch_size = check_int("batch_size", batch_size, minimum=1)
    values = np.asarray(labels)
    if values.dtype.kind not in "iub":
        _, values = np.unique(values, return_inverse=True)
    values = values.reshape(-1).astype(np.int64)
    if values.size and int(values.min()) < 0:
        values = values - int(values.min())
    kinds = int(values.max()) + 1 if values.size else 0
    overall = float(_entropy(np.bincount(values, minlength=kinds)[None, :])[0]) if kinds else 0.0
    if overall == 0.0:
        return 1.0
    batch = np.arange(values.size) // batch_size
    n_batches = int(batch[-1]) + 1
    counts = np.bincount(batch * kinds + values, minlength=n_batches * kinds)
    per_batch = _entropy(counts.reshape(n_batches, kinds))
    return float(per_batch.mean() / overall)


def order_mix(
    dataset: Any,
    indices: Sequence[int] | np.ndarray,
    batch_size: int,
    labels: Sequence[Any] | np.ndarray | None = None,
) -> float:
    """``batch_mix`` of an order of a dataset's indices, by file or by a label of each sample.

    Args:
        dataset: The dataset the indices index. Without ``labels`` it must have sessions (an
            ``HDF5SessionDataset``, or any whose ``loader_support()`` answers
            ``session_index()``): the label is then the file (session) of each sample.
        indices: The order, as a sampler yields it (one epoch).
        batch_size: Samples a batch.
        labels: Each dataset index's label (``labels[i]`` for index ``i``; an ``obs``
            column's codes, for example); ``None``: the file.

    Raises:
        ConfigError: Neither ``labels`` nor sessions to take the file from, or an index out of
            range of ``labels``.

    Example:
        >>> order_mix(ds, sampler.indices(), 64)  # doctest: +SKIP
        0.97
    """
    order = np.asarray(indices, np.int64).reshape(-1)
    if labels is None:
        support = support_of(dataset)
        index = support.session_index() if answers(support, "session_index") else None
        if index is None:
            raise ConfigError(
                f"order_mix: {type(dataset).__name__} has no sessions to take each sample's "
                "file from; pass labels= (each dataset index's label, e.g. an obs column)."
            )
        label_of = np.asarray(index.positions, np.int64)
    else:
        label_of = np.asarray(labels)
    if order.size and (int(order.min()) < 0 or int(order.max()) >= label_of.shape[0]):
        raise ConfigError(
            f"order_mix: an index of the order is outside 0..{label_of.shape[0] - 1}, the "
            "labels' range: pass the order of this dataset's indices."
        )
    return batch_mix(label_of[order], batch_size)


def _log_binomials(n: np.ndarray, top: int) -> np.ndarray:
    """``log C(n_j, k)`` for every ``n_j`` of ``n`` and ``k = 0..top`` (``-inf`` past ``n_j``)."""
    k = np.arange(top, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.log(np.maximum(n[:, None] - k[None, :], 0.0)) - np.log1p(k)[None, :]
    out = np.zeros((n.shape[0], top + 1))
    np.cumsum(terms, axis=1, out=out[:, 1:])
    return out


def shuffle_mix(counts: Sequence[int] | np.ndarray, batch_size: int) -> float:
    """The mix a full uniform shuffle gives labels held ``counts`` times, exactly.

    A batch of a uniform permutation holds ``k`` samples of a label held ``K`` times with the
    hypergeometric probability ``C(K, k) C(N - K, b - k) / C(N, b)``; the expected entropy of a
    batch is the sum over labels and ``k`` of that probability times ``-(k / b) log(k / b)``,
    here over the entropy of the counts. It is ``batch_mix`` of such an order averaged over
    every permutation, its whole batches (a real order's last, partial batch moves its figure
    by about one batch's share). Nothing random is drawn; the cost is labels x ``batch_size``.

    Args:
        counts: Samples of each label (a session's rows, an ``obs`` category's cells).
        batch_size: Samples a batch (at least the samples: one batch of all of them).

    Returns:
        The expected ratio, in ``[0, 1]``; 1.0 where there is one label or none.

    Example:
        >>> round(shuffle_mix([100, 100, 100, 100], 50), 3)
        0.981
        >>> shuffle_mix([300], 50), shuffle_mix([10, 10], 1000)
        (1.0, 1.0)
    """
    batch_size = check_int("batch_size", batch_size, minimum=1)
    held = np.asarray(counts, np.int64).reshape(-1)
    held = held[held > 0].astype(np.float64)
    overall = float(_entropy(held[None, :])[0]) if held.size else 0.0
    total = int(held.sum())
    if overall == 0.0 or batch_size >= total:
        return 1.0
    b = batch_size
    log_all = float(_log_binomials(np.array([float(total)]), b)[0, b])
    p = np.arange(b + 1) / b
    with np.errstate(divide="ignore", invalid="ignore"):
        h = np.where(p > 0, -p * np.log(p), 0.0)
    expected = 0.0
    step = max(1, 2_000_000 // (b + 1))  # labels at a time: bounded memory
    for at in range(0, held.size, step):
        part = held[at : at + step]
        mine = _log_binomials(part, b)  # log C(K, k)
        rest = _log_binomials(total - part, b)[:, ::-1]  # log C(N - K, b - k)
        expected += float((np.exp(mine + rest - log_all) * h[None, :]).sum())
    return min(1.0, expected / overall)
