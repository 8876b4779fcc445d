"""``balanced_weights``: per-sample weights, every category of an obs column equally likely.

For class-balanced draws with ``loaderkit.WeightedSampler``: each file's category codes are
read once (one vectorised read per file), mapped onto one category list shared by the files
by name (``loaderkit.hdf5.anndata.encoding.shared_categories``: files may list other categories,
in another order), then onto the dataset's samples through its session index (each sample's
file and row), so a dataset whose samples are some of the rows gets weights over those.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from loaderkit.errors import ArgumentTypeError, ConfigError, HDF5FileError, MissingKeyError
from loaderkit.hdf5.anndata.encoding import obs_column, shared_categories

__all__ = ["balanced_weights", "category_codes"]


def _path_of(dataset: Any, key: str) -> str:
    """The file path of ``key``: a name of the dataset's keys (``key={name: path}``), or a path."""
    keys = dataset.key
    if isinstance(keys, Mapping) and key in keys:
        return str(keys[key])
    return key


def category_codes(dataset: Any, key: str) -> tuple[list[str], np.ndarray]:
    """Every sample's category of the categorical column ``key``: ``(categories, codes)``.

    ``categories`` is the list shared by the dataset's files (the union, first seen first, as
    ``anndata.concat`` joins categoricals); ``codes`` (int64, one per sample, in dataset
    order) index it, ``-1`` where the sample's label is missing.

    Raises:
        ConfigError: ``key`` is not a categorical column of some file (named, with what it
            is), or a file lacks it (``MissingKeyError``).
        HDF5FileError: A code outside its file's category list (a damaged file).

    Example:
        >>> categories, codes = category_codes(ds, "obs/cell_type")  # doctest: +SKIP
    """
    ids = dataset.session_ids
    per_file: list[np.ndarray] = []
    lists: list[tuple[str, ...]] = []
    for sid in ids:
        where = str(dataset.files[sid])
        with dataset.lock:
            f = dataset.file(sid)
            column = obs_column(f, key, sid, where)
            if column is None:
                raise MissingKeyError(
                    f"balanced_weights: session {sid!r} ({where}) has no key {key!r}; pass an "
                    "obs column every file holds (e.g. 'obs/cell_type')."
                )
            if column.categories is None:
                raise ConfigError(
                    f"balanced_weights: key {key!r} of session {sid!r} ({where}) is "
                    f"{column.encoding}, not categorical: balanced weights need categories. "
                    "Store the column as a categorical (`adata.obs[col] = "
                    "adata.obs[col].astype('category')`) or compute the weights yourself."
                )
            codes = np.asarray(f[column.path][()], dtype=np.int64).ravel()
        size = len(column.categories)
        bad = np.flatnonzero((codes < -1) | (codes >= size))
        if bad.size:
            raise HDF5FileError(
                f"balanced_weights: key {key!r} of session {sid!r} ({where}): row "
                f"{int(bad[0])} has code {int(codes[bad[0]])}, but the column has {size} "
                "categories; the file is damaged. Write it again (anndata's write_h5ad)."
            )
        per_file.append(codes)
        lists.append(column.categories)
    shared, tables = shared_categories(lists)
    for k, table in enumerate(tables):
        if table is not None:
            codes = per_file[k]
            per_file[k] = np.where(codes >= 0, table[np.maximum(codes, 0)], -1)
    index = dataset.loader_support().session_index()
    starts = np.concatenate(([0], np.cumsum([c.shape[0] for c in per_file])))[:-1]
    flat = np.concatenate(per_file) if per_file else np.zeros(0, np.int64)
    positions = np.asarray(index.positions, np.int64)
    return shared, flat[starts[positions] + np.asarray(index.rows, np.int64)]


def balanced_weights(dataset: Any, key: str) -> np.ndarray:
    """Per-sample weights that make every category of ``key`` equally likely over the samples.

    The weights of the samples of each category present in the dataset sum to ``1 / k``
    (``k``: the categories with at least one sample); a sample whose label is missing
    (code ``-1``) weighs 0, and a category no sample has is left out. Give them to
    ``loaderkit.WeightedSampler`` for class-balanced draws.

    Args:
        dataset: An ``HDF5SessionDataset`` over ``.h5ad`` files.
        key: A categorical obs column, by path (``"obs/cell_type"``) or by the name the
            dataset serves it under (``key={"label": "obs/cell_type"}``: ``"label"``).

    Returns:
        A float64 array of ``len(dataset)`` weights, summing to 1.

    Raises:
        ConfigError: ``key`` is not categorical (named, with the file), or no sample has a
            label; ``ArgumentTypeError`` for a dataset without sessions or a key not a str.
        MissingKeyError: A file has no ``key`` (a ``KeyError``).

    Example:
        >>> from loaderkit import WeightedSampler, create_dataloader  # doctest: +SKIP
        >>> ds = HDF5SessionDataset(files, key=("X", "obs/cell_type"))  # doctest: +SKIP
        >>> sampler = WeightedSampler(balanced_weights(ds, "obs/cell_type"), len(ds))  # doctest: +SKIP
        >>> loader = create_dataloader(ds, batch_size=64, sampler=sampler, seed=0)  # doctest: +SKIP
    """  # noqa: E501
    if not isinstance(key, str):
        raise ArgumentTypeError(
            f"balanced_weights: key must be an obs column's path or name (str), got "
            f"{type(key).__name__} {key!r}"
        )
    if not callable(getattr(dataset, "file", None)) or not hasattr(dataset, "session_ids"):
        raise ArgumentTypeError(
            "balanced_weights: dataset must be an HDF5SessionDataset over .h5ad files, got "
            f"{type(dataset).__name__}"
        )
    path = _path_of(dataset, key)
    categories, codes = category_codes(dataset, path)
    labelled = codes >= 0
    counts = np.bincount(codes[labelled], minlength=len(categories))
    present = int(np.count_nonzero(counts))
    if present == 0:
        raise ConfigError(
            f"balanced_weights: no sample of the dataset has a label in {path!r} (every code "
            "is -1, missing), so no category can be weighed. Pass a column with labels."
        )
    weights = np.zeros(codes.shape[0], np.float64)
    weights[labelled] = 1.0 / (present * counts[codes[labelled]])
    return weights
