"""``normalize_total`` and ``log1p`` against scanpy's formula, on tensors and on loader batches.

The reference is scanpy's documented rule, written with scipy.sparse in float64: a row's total
over the columns it holds, divided by ``target_sum``, 1 where that is 0; the row divided by it;
then ``log1p``. One test compares with scanpy itself when it is installed. The loader tests read
files anndata wrote, through ``create_dataloader(HDF5SessionDataset(files, key="X"))``, in the
``csr`` and ``dense`` forms and after ``genes=``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from loaderkit import create_dataloader
from loaderkit.errors import ArgumentTypeError, ConfigError
from loaderkit.hdf5 import HDF5SessionDataset
from loaderkit.singlecell import log1p, normalize_total

anndata = pytest.importorskip("anndata")
sp = pytest.importorskip("scipy.sparse")

from tests.hdf5.h5adfiles import GENE_NAMES, matrix, write_current  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def reference(m: Any, target_sum: float) -> tuple[np.ndarray, np.ndarray]:
    """scanpy's ``normalize_total`` then ``log1p`` of ``m``'s rows, dense, in float64."""
    x = sp.csr_matrix(m, dtype=np.float64)
    divisors = np.asarray(x.sum(axis=1)).ravel() / target_sum
    divisors[divisors == 0] = 1
    normalized = sp.csr_matrix(sp.diags(1 / divisors) @ x).toarray()
    return normalized, np.log1p(normalized)


def csr_tensor(m: Any, dtype: torch.dtype, index: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.sparse_csr_tensor(
        torch.from_numpy(m.indptr).to(index),
        torch.from_numpy(m.indices).to(index),
        torch.from_numpy(m.data).to(dtype),
        m.shape,
        check_invariants=m.nnz > 0,  # torch 2.4's check refuses 0 stored values
    )


def dense(t: torch.Tensor) -> np.ndarray:
    t = t.to_dense() if t.layout != torch.strided else t
    return t.cpu().to(torch.float64).numpy()


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    return {"rtol": 1e-12, "atol": 0} if dtype == torch.float64 else {"rtol": 2e-6, "atol": 1e-6}


def counts() -> Any:
    """40 cells x 50 genes of small counts; rows 0 and 17 empty, row 5 stored zeros only."""
    m = sp.csr_matrix(matrix(0, cells=40))
    m.sort_indices()  # as torch's CSR tensors hold them (and loaderkit's batches are)
    m.data[m.indptr[5] : m.indptr[6]] = 0  # stored, but zero: the total is 0
    assert m.indptr[6] > m.indptr[5] and m.indptr[1] == 0 and m.indptr[18] == m.indptr[17]
    return m


# ------------------------------------------------------------------ values, layout, dtype


@pytest.mark.parametrize(
    ("dtype", "out"),
    [
        (torch.int32, torch.float32),
        (torch.int64, torch.float32),
        (torch.uint8, torch.float32),
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.float32),
        (torch.float64, torch.float64),
    ],
)
def test_csr_and_dense_equal_scanpys_formula(dtype: torch.dtype, out: torch.dtype) -> None:
    m = counts()
    normalized, logged = reference(m, 1e4)
    for batch in (csr_tensor(m, dtype), torch.from_numpy(m.toarray()).to(dtype)):
        got = normalize_total(batch, target_sum=1e4)
        both = log1p(got)
        for result, truth in ((got, normalized), (both, logged)):
            assert result.layout == batch.layout and result.dtype == out
            assert result.shape == batch.shape and result.device == batch.device
            np.testing.assert_allclose(dense(result), truth, **tolerance(out))
        assert np.isfinite(dense(both)).all()
        assert not dense(both)[[0, 5, 17]].any()  # no counts: still zeros
        np.testing.assert_allclose(dense(got).sum(axis=1)[[1, 2, 3]], 1e4, rtol=1e-5)


@pytest.mark.parametrize("index", [torch.int32, torch.int64])
def test_csr_keeps_its_indices_and_never_densifies(index: torch.dtype) -> None:
    """The result shares the input's crow and col indices; only the values are new."""
    batch = csr_tensor(counts(), torch.float32, index)
    for result in (normalize_total(batch, target_sum=10), log1p(batch)):
        assert result.layout == torch.sparse_csr
        for part in ("crow_indices", "col_indices"):
            mine, theirs = getattr(result, part)(), getattr(batch, part)()
            assert mine.dtype == index and mine.data_ptr() == theirs.data_ptr()
        assert result.values().numel() == batch.values().numel()
        assert result.values().data_ptr() != batch.values().data_ptr()


def test_inputs_are_never_modified() -> None:
    m = counts()
    for batch in (csr_tensor(m, torch.float32), torch.from_numpy(m.toarray())):
        before = dense(batch).copy()
        for result in (normalize_total(batch, target_sum=7), log1p(batch)):
            assert not np.array_equal(dense(result), before)  # new values, elsewhere
        assert np.array_equal(dense(batch), before)


def test_cells_with_no_counts_and_other_target_sums() -> None:
    """A row of zeros, empty or stored, stays zeros; every other row sums to target_sum."""
    data, indices, indptr = [2, 6, 0, 5], [0, 2, 1, 1], [0, 0, 2, 3, 4]  # row 2: a stored 0
    m = sp.csr_matrix((np.array(data, np.int64), indices, indptr), shape=(4, 3))
    for target in (1, 1e4, 123.5, np.float32(3.0), np.int64(2)):
        for batch in (csr_tensor(m, torch.int64), torch.from_numpy(m.toarray())):
            got = dense(normalize_total(batch, target_sum=target))
            np.testing.assert_allclose(got, reference(m, float(target))[0], rtol=1e-6)
            np.testing.assert_allclose(got.sum(axis=1), [0, target, 0, target], rtol=1e-6)
    empty = torch.zeros(0, 4)
    assert normalize_total(empty).shape == (0, 4) and log1p(empty.to_sparse_csr()).shape == (0, 4)
    nothing = csr_tensor(sp.csr_matrix((3, 4), dtype=np.int32), torch.int32)  # no stored value
    got = normalize_total(nothing)
    assert got.layout == torch.sparse_csr and got.dtype == torch.float32 and got.shape == (3, 4)
    assert got.values().numel() == 0 and torch.equal(got.crow_indices(), nothing.crow_indices())


def test_a_dict_batch_with_key() -> None:
    """key= names the matrix; the result is a new dict, every other entry the same object."""
    m = counts()
    labels = torch.arange(40)
    for x in (csr_tensor(m, torch.float32), torch.from_numpy(m.toarray())):
        batch = {"X": x, "obs/cell_type": labels}
        got = log1p(normalize_total(batch, target_sum=1e4, key="X"), key="X")
        assert list(got) == ["X", "obs/cell_type"] and got["obs/cell_type"] is labels
        assert batch["X"] is x  # the caller's dict is as it was
        np.testing.assert_allclose(dense(got["X"]), reference(m, 1e4)[1], rtol=2e-6, atol=1e-6)
        assert got["X"].layout == x.layout
        with pytest.raises(
            ConfigError, match=r"is a dict \(keys \['X', 'obs/cell_type'\]\).*key='X'"
        ):
            normalize_total(batch)
        with pytest.raises(ConfigError, match=r"key='x' is not in the batch.*\['X', 'obs/cell_"):
            log1p(batch, key="x")
        with pytest.raises(ConfigError, match=r"batch\['obs/cell_type'\] is a 1-D tensor"):
            log1p({"X": x, "obs/cell_type": labels}, key="obs/cell_type")
    with pytest.raises(ConfigError, match=r"key='X' names the matrix of a dict batch.*Tensor"):
        normalize_total(torch.ones(2, 2), key="X")


def test_target_sum_is_a_positive_finite_number() -> None:
    batch = torch.ones(2, 3)
    with pytest.raises(ConfigError, match=r"target_sum=None .*median.*no meaning for one batch"):
        normalize_total(batch, target_sum=None)  # type: ignore[arg-type]
    for bad in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match=rf"positive finite number.*got {bad!r}"):
            normalize_total(batch, target_sum=bad)
    for bad in ("1e4", True, torch.tensor(1e4)):
        with pytest.raises(ArgumentTypeError, match="target_sum must be a number"):
            normalize_total(batch, target_sum=bad)  # type: ignore[arg-type]


def test_what_is_not_a_batch_is_refused_by_name() -> None:
    m = sp.csr_matrix(np.eye(3, dtype=np.float32))
    x = torch.from_numpy(m.toarray())
    cases: list[tuple[Any, type[Exception], str]] = [
        ([[1.0, 2.0]], ArgumentTypeError, "the batch is a list; expected a 2-D tensor"),
        (m.toarray(), ArgumentTypeError, "the batch is a ndarray; expected a 2-D tensor"),
        (x[0], ConfigError, r"the batch is a 1-D tensor of shape \(3,\).*row\[None\]"),
        (x[None], ConfigError, r"the batch is a 3-D tensor of shape \(1, 3, 3\)"),
        (x.to_sparse(), ConfigError, r"the batch has layout torch.sparse_coo.*to_sparse_csr"),
        (x.to_sparse_csc(), ConfigError, r"the batch has layout torch.sparse_csc.*to_sparse_csr"),
        (x.to(torch.complex64), ArgumentTypeError, "the batch holds complex values"),
        (x[None].to_sparse_csr(), ConfigError, "the batch is a 3-D tensor"),  # batched CSR
    ]
    for batch, kind, message in cases:
        for function in (normalize_total, log1p):
            with pytest.raises(kind, match=f"{function.__name__}: {message}"):
                function(batch)


# ------------------------------------------------------------------ loader batches


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], np.ndarray]:
    """2 files x 200 cells x 50 genes written by anndata (float32; gzip); the dense truth."""
    root = tmp_path_factory.mktemp("normalize")
    paths = [
        write_current(root / "n0.h5ad", matrix(0)),
        write_current(root / "n1.h5ad", matrix(1), compression="gzip"),
    ]
    truth = np.concatenate([anndata.read_h5ad(p).X.toarray() for p in paths])
    return paths, truth


ORDER = np.random.default_rng(0).permutation(400).tolist()


@pytest.mark.parametrize("sparse", ["csr", "dense"])
@pytest.mark.parametrize("genes", [None, ["gene7", "gene3", "gene40", "gene0"]])
def test_loader_batches_equal_the_reference(
    files: tuple[list[Path], np.ndarray], sparse: str, genes: list[str] | None
) -> None:
    """Totals are over the columns served: after genes=, over the kept genes."""
    paths, truth = files
    columns = [GENE_NAMES.index(g) for g in genes] if genes else list(range(50))
    with HDF5SessionDataset(paths, key="X", sparse=sparse, genes=genes) as ds:
        with create_dataloader(ds, batch_size=64, sampler=ORDER) as loader:
            for start, batch in zip(range(0, 400, 64), loader, strict=True):
                rows = truth[ORDER[start : start + 64]][:, columns]
                got = log1p(normalize_total(batch, target_sum=1e4))
                assert got.layout == batch.layout and got.dtype == torch.float32
                _, logged = reference(sp.csr_matrix(rows), 1e4)
                np.testing.assert_allclose(dense(got), logged, rtol=2e-6, atol=1e-6)


def test_integer_counts_and_labels_from_a_file(tmp_path: Path) -> None:
    """An int32 X (raw counts) and a dict batch: key=("X", "obs/cell_type")."""
    m = matrix(3).astype(np.int32)
    path = write_current(tmp_path / "ints.h5ad", m)
    with HDF5SessionDataset([path], key=("X", "obs/cell_type")) as ds:
        batch = next(iter(create_dataloader(ds, batch_size=200)))
        assert batch["X"].dtype == torch.int32 and batch["X"].layout == torch.sparse_csr
        got = log1p(normalize_total(batch, key="X"), key="X")
    assert got["X"].dtype == torch.float32 and got["obs/cell_type"] is batch["obs/cell_type"]
    np.testing.assert_allclose(dense(got["X"]), reference(m, 1e4)[1], rtol=2e-6, atol=1e-6)


def test_a_tokens_batch_is_refused_by_name(files: tuple[list[Path], np.ndarray]) -> None:
    with HDF5SessionDataset(files[0], key="X", sparse="tokens") as ds:
        batch = next(iter(create_dataloader(ds, batch_size=8)))
    with pytest.raises(ArgumentTypeError, match=r"batch\['values'\] is a Padded \(sparse="):
        normalize_total(batch, key="values")


# fork: batches in shared-memory slots, which the loop keeps through the results' shared
# indices; threads: batches built in this process by worker threads
@pytest.mark.parametrize(
    "options",
    [
        {"num_workers": 2, "multiprocessing_context": "fork"},
        {"num_workers": 2, "worker_method": "thread"},
    ],
    ids=["fork", "threads"],
)
def test_kept_results_of_worker_batches_stay_right(
    files: tuple[list[Path], np.ndarray], options: dict[str, Any]
) -> None:
    """A result shares its batch's indices: keeping it keeps the batch's slot from reuse."""
    paths, truth = files
    with HDF5SessionDataset(paths, key="X") as ds:
        with create_dataloader(ds, batch_size=32, sampler=ORDER, **options) as loader:
            kept = [log1p(normalize_total(batch)) for batch in loader]
    assert len(kept) == 13
    got = np.concatenate([dense(t) for t in kept])
    np.testing.assert_allclose(got, reference(sp.csr_matrix(truth[ORDER]), 1e4)[1], rtol=2e-6)


# ------------------------------------------------------------------ scanpy, CUDA


def test_equals_scanpy_itself() -> None:
    """scanpy's pp.normalize_total + pp.log1p, where scanpy is installed (not a dependency)."""
    sc = pytest.importorskip("scanpy")
    for m in (counts(), counts().astype(np.int32), counts().astype(np.float64)):
        for target in (1e4, 1e6, 2.5):
            adata = anndata.AnnData(X=m.copy())
            sc.pp.normalize_total(adata, target_sum=target)
            normalized = adata.X.toarray()
            sc.pp.log1p(adata)
            dtype = torch.from_numpy(m.data).dtype
            out = torch.float64 if dtype == torch.float64 else torch.float32
            for batch in (csr_tensor(m, dtype), torch.from_numpy(m.toarray())):
                got = normalize_total(batch, target_sum=target)
                np.testing.assert_allclose(dense(got), normalized, **tolerance(out))
                np.testing.assert_allclose(dense(log1p(got)), adata.X.toarray(), **tolerance(out))
                assert got.dtype == out and str(adata.X.dtype) == str(out).split(".")[1]


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("dtype", [torch.int32, torch.float16, torch.float32, torch.float64])
def test_on_cuda_the_result_stays_on_the_gpu(dtype: torch.dtype) -> None:
    m = counts()
    out = torch.float64 if dtype == torch.float64 else torch.float32
    for batch in (csr_tensor(m, dtype, torch.int32), torch.from_numpy(m.toarray()).to(dtype)):
        on_gpu = batch.to("cuda")
        got = log1p(normalize_total(on_gpu, target_sum=1e4))
        assert got.device.type == "cuda" and got.layout == batch.layout and got.dtype == out
        np.testing.assert_allclose(dense(got), reference(m, 1e4)[1], **tolerance(out))
        if batch.layout == torch.sparse_csr:
            assert got.crow_indices().data_ptr() == on_gpu.crow_indices().data_ptr()


@pytest.mark.cuda
@cuda
def test_on_cuda_loader_batches(files: tuple[list[Path], np.ndarray]) -> None:
    paths, truth = files
    with HDF5SessionDataset(paths, key=("X", "obs/cell_type")) as ds:
        with create_dataloader(ds, batch_size=100) as loader:
            got = [log1p(normalize_total(b["X"].to("cuda"))) for b in loader]
    assert all(g.device.type == "cuda" and g.layout == torch.sparse_csr for g in got)
    logged = np.concatenate([dense(g) for g in got])
    np.testing.assert_allclose(logged, reference(sp.csr_matrix(truth), 1e4)[1], rtol=2e-6)
