"""Counts normalised on the batch: scanpy's ``normalize_total`` and ``log1p`` on tensors.

``normalize_total`` scales each cell (row) of a batch so that its values sum to
``target_sum``; ``log1p`` is ``log(1 + x)`` of every stored value. Together they give what
scanpy's ``pp.normalize_total(adata, target_sum=...)`` followed by ``pp.log1p(adata)`` gives on
the same rows, within float tolerance, without densifying a sparse batch:

* a ``torch.sparse_csr_tensor`` ``(cells, genes)`` (what ``HDF5SessionDataset(files,
  key="X")`` batches are) stays CSR: the result shares the input's ``crow_indices`` and
  ``col_indices``, only its values are new. Each row's total is one segment sum over the
  values (``torch.segment_reduce`` with the ``crow_indices`` as offsets), spread back over the
  values by ``torch.repeat_interleave``: no loop over rows, no dense intermediate;
* a dense 2-D tensor (``sparse="dense"``) stays dense;
* a dict batch (``key=("X", "obs/cell_type")``): pass ``key=`` naming the matrix, and a new
  dict comes back with that entry replaced and every other entry as it was; or pass
  ``batch["X"]`` itself.

The result is on the input's device (torch ops only, so CUDA tensors stay on the GPU). The
input is never modified in place: a batch the loop keeps stays as it was. A CSR result holds
its batch's index tensors, so keeping the result keeps them (and, with worker processes, the
batch's shared-memory slot, as keeping the batch itself would: ``docs/handoff.md``).

dtypes: integer and bool counts become float32 (as scanpy turns integer matrices into
float32); float32 stays float32 and float64 stays float64; float16 and bfloat16 are computed
in float32 and returned as float32.

Totals are over the columns the batch holds: after ``genes=`` (or a join of files with
different genes), over the genes served. A cell whose total is 0 is left as it is (all
zeros stay zeros, no NaN or inf), as scanpy leaves it.

Examples:
    >>> import torch
    >>> counts = torch.tensor([[1, 3, 0], [0, 0, 0]])
    >>> normalize_total(counts, target_sum=100)
    tensor([[25., 75.,  0.],
            [ 0.,  0.,  0.]])
    >>> log1p(normalize_total(counts.to_sparse_csr(), target_sum=3)).values()
    tensor([0.5596, 1.1787])
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any, overload

import torch

from loaderkit.errors import ArgumentTypeError, ConfigError

__all__ = ["log1p", "normalize_total"]

#: What both functions accept, said in their errors.
_EXPECTED = (
    "a 2-D tensor of cells x genes: a torch.sparse_csr_tensor (as HDF5SessionDataset(files, "
    'key="X") batches are) or a dense tensor (sparse="dense")'
)


@overload
def normalize_total(
    batch: torch.Tensor, target_sum: float = ..., *, key: None = ...
) -> torch.Tensor: ...


@overload
def normalize_total(
    batch: Mapping[str, Any], target_sum: float = ..., *, key: str
) -> dict[str, Any]: ...


def normalize_total(
    batch: torch.Tensor | Mapping[str, Any], target_sum: float = 1e4, *, key: str | None = None
) -> torch.Tensor | dict[str, Any]:
    """Each cell's counts scaled to sum to ``target_sum``, as scanpy's ``pp.normalize_total``.

    A row's total is the sum of its values over the columns the batch holds; its values are
    divided by ``total / target_sum``. A row whose total is 0 is left as it is (scanpy's
    rule), so a cell with no counts stays all zeros.

    Args:
        batch: A 2-D tensor, cells x genes: a ``torch.sparse_csr_tensor`` (the result is CSR
            with the same ``crow_indices`` and ``col_indices``) or a dense tensor (the result
            is dense). Or a dict batch with ``key=`` naming the matrix.
        target_sum: The total each cell is scaled to: a positive finite number. scanpy's
            ``None`` (the median of the cells' totals over the whole data set) is refused: one
            batch does not know the data set's median. Compute the median once over the data
            set (for example of ``obs["n_counts"]``) and pass it here.
        key: For a dict batch, the name of the matrix in it (``"X"`` for
            ``key=("X", "obs/cell_type")``); ``None`` for a tensor batch.

    Returns:
        A new tensor on the input's device: float32 for integer, bool, float16, bfloat16 and
        float32 input, float64 for float64 input. For a dict batch, a new dict with the
        ``key`` entry replaced and every other entry the same object. The input is not
        modified.

    Raises:
        ConfigError: ``target_sum`` is ``None``, not positive or not finite; the tensor is not
            2-D or not CSR or dense (a COO or CSC tensor, a single row); ``key`` is missing for
            a dict batch, not in it, or given for a tensor batch.
        ArgumentTypeError: ``target_sum`` is not a number; the batch is not a tensor (or the
            dict's entry is not); its values are complex.

    Examples:
        >>> import torch
        >>> batch = torch.tensor([[1.0, 0.0, 3.0], [0.0, 2.0, 2.0]]).to_sparse_csr()
        >>> out = normalize_total(batch, target_sum=10)
        >>> out.layout, out.values()
        (torch.sparse_csr, tensor([2.5000, 7.5000, 5.0000, 5.0000]))
        >>> out.col_indices().data_ptr() == batch.col_indices().data_ptr()  # shared
        True
        >>> normalize_total({"X": torch.tensor([[2, 2]]), "y": 7}, target_sum=1, key="X")
        {'X': tensor([[0.5000, 0.5000]]), 'y': 7}
    """
    total = _target_sum(target_sum)
    matrix, rewrap = _matrix(batch, key, "normalize_total")
    return rewrap(_normalized(matrix, total))


@overload
def log1p(batch: torch.Tensor, *, key: None = ...) -> torch.Tensor: ...


@overload
def log1p(batch: Mapping[str, Any], *, key: str) -> dict[str, Any]: ...


def log1p(
    batch: torch.Tensor | Mapping[str, Any], *, key: str | None = None
) -> torch.Tensor | dict[str, Any]:
    """``log(1 + x)`` of every value, as scanpy's ``pp.log1p`` (natural logarithm).

    A CSR batch stays CSR: only its stored values change (``log1p(0) == 0``, so the zeros it
    does not store stay zeros), and the result shares the input's ``crow_indices`` and
    ``col_indices``. A dense batch stays dense.

    Args:
        batch: A 2-D tensor, cells x genes: a ``torch.sparse_csr_tensor`` or a dense tensor.
            Or a dict batch with ``key=`` naming the matrix.
        key: For a dict batch, the name of the matrix in it; ``None`` for a tensor batch.

    Returns:
        A new tensor on the input's device, of the dtype ``normalize_total`` gives (float32,
        or float64 for float64 input); for a dict batch, a new dict with the ``key`` entry
        replaced. The input is not modified.

    Raises:
        ConfigError: The tensor is not 2-D or not CSR or dense; ``key`` is missing for a dict
            batch, not in it, or given for a tensor batch.
        ArgumentTypeError: The batch is not a tensor (or the dict's entry is not); its values
            are complex.

    Examples:
        >>> import torch
        >>> log1p(torch.tensor([[0, 1], [3, 0]]))
        tensor([[0.0000, 0.6931],
                [1.3863, 0.0000]])
        >>> x = normalize_total(torch.tensor([[1, 0, 3]]).to_sparse_csr(), target_sum=1e4)
        >>> log1p(x).values()
        tensor([7.8244, 8.9228])
    """
    matrix, rewrap = _matrix(batch, key, "log1p")
    dtype = _compute_dtype(matrix)
    if matrix.layout == torch.strided:
        return rewrap(torch.log1p(matrix.to(dtype)))
    return rewrap(_with_values(matrix, torch.log1p(matrix.values().to(dtype))))


# ------------------------------------------------------------------ the arithmetic


def _normalized(matrix: torch.Tensor, target_sum: float) -> torch.Tensor:
    """``matrix``'s rows divided by ``total / target_sum`` (by 1 where that is 0)."""
    dtype = _compute_dtype(matrix)
    if matrix.layout == torch.strided:
        values = matrix.to(dtype)
        return values / _divisors(values.sum(dim=1, keepdim=True), target_sum)
    values = matrix.values().to(dtype)
    if values.numel() == 0:  # no stored values: nothing to scale (and older torch refuses)
        return _with_values(matrix, values.clone())
    offsets = matrix.crow_indices().to(torch.int64)
    # unsafe: a CSR tensor's offsets are valid; the checks would wait for a GPU (.item())
    totals = torch.segment_reduce(values, "sum", offsets=offsets, unsafe=True)
    per_value = torch.repeat_interleave(
        _divisors(totals, target_sum), offsets.diff(), output_size=values.numel()
    )
    return _with_values(matrix, values / per_value)


def _divisors(totals: torch.Tensor, target_sum: float) -> torch.Tensor:
    """The divisors scanpy uses: ``total / target_sum``, and 1 where that is 0 (row kept)."""
    divisors = totals / target_sum
    return divisors.masked_fill_(divisors == 0, 1)


def _with_values(matrix: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """A CSR tensor with ``matrix``'s indices (shared, not copied) and ``values``."""
    return torch.sparse_csr_tensor(
        matrix.crow_indices(),
        matrix.col_indices(),
        values,
        size=matrix.shape,
        check_invariants=False,
    )


def _compute_dtype(matrix: torch.Tensor) -> torch.dtype:
    """float64 for float64, float32 for everything else (integers, bool, half floats)."""
    return torch.float64 if matrix.dtype == torch.float64 else torch.float32


# ------------------------------------------------------------------ the checks


def _target_sum(value: Any) -> float:
    """``value`` as a float, or the error that says why it cannot be a target sum."""
    if value is None:
        raise ConfigError(
            "normalize_total: target_sum=None (scanpy's default: the median of every cell's "
            "total over the whole data set) has no meaning for one batch, whose median changes "
            "from batch to batch. Compute the median once over the data set (for example "
            'numpy.median(adata.obs["n_counts"]), or of the row sums of X) and pass it as '
            "target_sum=..., or pass a fixed number such as target_sum=1e4"
        )
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(
            f"normalize_total: target_sum must be a number (the total each cell is scaled to, "
            f"such as 1e4), got {type(value).__name__} {value!r}"
        )
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise ConfigError(
            f"normalize_total: target_sum must be a positive finite number (the total each "
            f"cell is scaled to, such as 1e4), got {value!r}"
        )
    return number


def _matrix(
    batch: Any, key: str | None, function: str
) -> tuple[torch.Tensor, Callable[[torch.Tensor], Any]]:
    """The matrix in ``batch``, checked, and how to put a result back where it was."""
    if isinstance(batch, Mapping):
        if key is None:
            matrices = [k for k, v in batch.items() if isinstance(v, torch.Tensor) and v.ndim == 2]
            hint = f"key={matrices[0]!r}" if matrices else "key=..."
            raise ConfigError(
                f"{function}: the batch is a dict (keys {list(batch)}): name its matrix with "
                f"{hint}, or pass the matrix itself ({function}(batch[...]))"
            )
        if key not in batch:
            raise ConfigError(
                f"{function}: key={key!r} is not in the batch, whose keys are {list(batch)}: "
                "name the matrix as the dataset's key= names it"
            )
        matrix = _checked(batch[key], f"batch[{key!r}]", function)

        def rewrap(result: torch.Tensor) -> dict[str, Any]:
            out = dict(batch)
            out[key] = result
            return out

        return matrix, rewrap
    if key is not None:
        raise ConfigError(
            f"{function}: key={key!r} names the matrix of a dict batch, but the batch is a "
            f"{type(batch).__name__}: leave key out"
        )
    return _checked(batch, "the batch", function), _same


def _same(result: torch.Tensor) -> torch.Tensor:
    return result


def _checked(matrix: Any, what: str, function: str) -> torch.Tensor:
    """``matrix`` if it is a 2-D CSR or dense real tensor, else the error naming what it is."""
    if not isinstance(matrix, torch.Tensor):
        tokens = (
            ' (sparse="tokens" batches are not supported: read with sparse="csr")'
            if type(matrix).__name__ == "Padded"
            else ""
        )
        raise ArgumentTypeError(
            f"{function}: {what} is a {type(matrix).__name__}{tokens}; expected {_EXPECTED}"
        )
    if matrix.layout not in (torch.strided, torch.sparse_csr):
        raise ConfigError(
            f"{function}: {what} has layout {matrix.layout} (shape {tuple(matrix.shape)}); "
            f"expected {_EXPECTED}. Convert it with .to_sparse_csr() (or .to_dense())"
        )
    if matrix.ndim != 2 or (matrix.layout == torch.sparse_csr and matrix.values().ndim != 1):
        raise ConfigError(
            f"{function}: {what} is a {matrix.ndim}-D tensor of shape {tuple(matrix.shape)}; "
            f"expected {_EXPECTED}. A single cell is a batch of one: row[None] for a dense "
            "row, or normalise the loader's batches instead of single samples"
        )
    if matrix.dtype.is_complex:
        raise ArgumentTypeError(
            f"{function}: {what} holds complex values ({matrix.dtype}); expected counts "
            "(integers or floats)"
        )
    return matrix
