"""AnnData ``.h5ad`` files end to end: CSR rows as samples, batches, workers, resume, damage.

Files are written by anndata itself (current encoding; uncompressed: chunked, read from raw
chunks; gzip: decoded chunks) and by hand in the legacy encoding (contiguous: ``preadv``);
every row is compared with anndata's own reading.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

from loaderkit import DataLoader, create_dataloader
from loaderkit.errors import ConfigError, HDF5FileError
from loaderkit.hdf5 import BlockShuffleSampler, HDF5SessionDataset
from loaderkit.workers.collate import Padded, pad_collate

anndata = pytest.importorskip("anndata")
sp = pytest.importorskip("scipy.sparse")

from tests.hdf5.h5adfiles import (  # noqa: E402
    GENE_NAMES,
    matrix,
    write_csr,
    write_current,
    write_legacy,
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], np.ndarray]:
    """3 files x 200 cells x 50 genes: uncompressed, gzip, and uncompressed; the dense truth."""
    root = tmp_path_factory.mktemp("h5ad")
    paths = [
        write_current(root / "s0.h5ad", matrix(0)),
        write_current(root / "s1.h5ad", matrix(1), compression="gzip"),
        write_current(root / "s2.h5ad", matrix(2)),
    ]
    truth = np.concatenate([anndata.read_h5ad(p).X.toarray() for p in paths])
    return paths, truth


def dense(batch: Any) -> np.ndarray:
    return batch.to_dense().numpy() if batch.layout != torch.strided else batch.numpy()


@pytest.mark.parametrize("key", ["X", "raw/X", "layers/counts"])
def test_rows_equal_anndata(corpus: tuple[list[Path], np.ndarray], key: str) -> None:
    paths, truth = corpus
    with HDF5SessionDataset(paths, key=key) as ds:
        assert len(ds) == truth.shape[0]
        for i in (0, 17, 199, 200, 333, 599):
            row = ds[i]
            assert row.layout == torch.sparse_coo and row.shape == (50,)
            assert np.array_equal(row.to_dense().numpy(), truth[i])
        batch = DataLoader(ds, batch_size=len(ds), num_workers=0).__iter__().__next__()
        assert batch.layout == torch.sparse_csr and batch.dtype == torch.float32
        assert np.array_equal(dense(batch), truth)
        backed = anndata.read_h5ad(paths[1], backed="r")
        try:
            assert np.array_equal(ds[205].to_dense().numpy(), backed.X[5].toarray()[0])
        finally:
            backed.file.close()  # never leave a file open for a forked worker to inherit


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_legacy_files_read_as_anndata_reads_them(tmp_path: Path, compression: str | None) -> None:
    paths = [write_legacy(tmp_path / f"l{i}.h5ad", matrix(i), compression) for i in range(2)]
    truth = np.concatenate([matrix(i).toarray() for i in range(2)])
    for key in ("X", "raw.X"):
        with HDF5SessionDataset(paths, key=key) as ds:
            assert ds.handles.var_names == GENE_NAMES
            got = dense(next(iter(DataLoader(ds, batch_size=400, shuffle=False))))
            assert np.array_equal(got, truth)
    ours = dense(HDF5SessionDataset(paths[:1], key="raw.X").__getitems__([3, 1, 2])[:1][0][None])
    assert np.array_equal(ours, truth[[3]])


def test_dense_and_token_forms_and_gene_subsets(corpus: tuple[list[Path], np.ndarray]) -> None:
    paths, truth = corpus
    rows = [5, 400, 3, 250, 17, 6]
    with HDF5SessionDataset(paths, key="X", sparse="dense") as ds:
        batch = next(iter(DataLoader(ds, batch_size=6, sampler=rows)))
        assert batch.layout == torch.strided and np.array_equal(batch.numpy(), truth[rows])
        assert np.array_equal(ds[400], truth[400])
    chosen = ["gene7", "gene3", "gene40"]
    with HDF5SessionDataset(paths, key="X", sparse="dense", genes=chosen) as ds:
        assert ds.handles.n_vars == 3
        got = next(iter(DataLoader(ds, batch_size=6, sampler=rows))).numpy()
        assert np.array_equal(got, truth[rows][:, [7, 3, 40]])
    mask = np.zeros(50, bool)
    mask[10:20] = True
    with HDF5SessionDataset(paths, key="X", genes=mask) as ds:
        got = dense(next(iter(DataLoader(ds, batch_size=6, sampler=rows))))
        assert np.array_equal(got, truth[rows][:, 10:20])
    with HDF5SessionDataset(paths, key="X", sparse="tokens") as ds:
        batch = next(iter(DataLoader(ds, batch_size=6, sampler=rows)))
        assert isinstance(batch["genes"], Padded)
        padded = pad_collate([ds[i] for i in rows])
        for name in ("genes", "values"):
            assert torch.equal(batch[name].values, padded[name].values)
            assert torch.equal(batch[name].lengths, padded[name].lengths)
        for j, i in enumerate(rows):
            n = int(batch["genes"].lengths[j])
            ids = batch["genes"].values[j, :n].numpy()  # in the file's order (not sorted here)
            assert np.array_equal(np.sort(ids), np.flatnonzero(truth[i]))
            assert np.array_equal(batch["values"].values[j, :n].numpy(), truth[i][ids])


def _epoch(ds: Any, **kwargs: Any) -> list[np.ndarray]:
    with create_dataloader(ds, batch_size=64, seed=3, **kwargs) as loader:
        return [dense(b) for b in loader]


# fork: the dataset inherited, handles reopened; spawn: the reader pickled (indptr re-read);
# threads: one reader shared by two threads
@pytest.mark.parametrize(
    "options",
    [
        {"num_workers": 2, "multiprocessing_context": "fork"},
        {"num_workers": 2, "multiprocessing_context": "spawn"},
        {"num_workers": 2, "worker_method": "thread"},
    ],
    ids=["fork", "spawn", "threads"],
)
def test_batches_identical_with_workers(
    corpus: tuple[list[Path], np.ndarray], options: dict[str, Any]
) -> None:
    paths, truth = corpus
    with HDF5SessionDataset(paths, key="X") as ds:
        alone = _epoch(ds, shuffle=True, num_workers=0)
        assert np.array_equal(np.sort(np.concatenate(alone), axis=0), np.sort(truth, axis=0))
        other = _epoch(ds, shuffle=True, **options)
        assert all(np.array_equal(a, b) for a, b in zip(alone, other, strict=True))


def test_block_shuffle_reads_every_row_once(corpus: tuple[list[Path], np.ndarray]) -> None:
    paths, truth = corpus
    with HDF5SessionDataset(paths, key="X", sparse="dense") as ds:
        sampler = BlockShuffleSampler(ds, seed=0, block_size=16)
        order = list(sampler)
        got = np.concatenate(_epoch(ds, sampler=sampler))
        assert np.array_equal(got, truth[order])


def test_resume_mid_epoch_gives_the_remaining_batches(
    corpus: tuple[list[Path], np.ndarray],
) -> None:
    paths, _ = corpus
    ds = HDF5SessionDataset(paths, key="X")
    full = _epoch(ds, shuffle=True)
    with create_dataloader(ds, batch_size=64, seed=3, shuffle=True) as first:
        iterator = iter(first)
        seen = [dense(next(iterator)) for _ in range(3)]
        state = first.state_dict()
    with create_dataloader(ds, batch_size=64, seed=3, shuffle=True) as second:
        second.load_state_dict(state)
        rest = [dense(b) for b in second]
    assert len(seen) + len(rest) == len(full)
    assert all(np.array_equal(a, b) for a, b in zip(seen + rest, full, strict=True))


def test_dense_x_and_obsm_keep_working(tmp_path: Path) -> None:
    path = tmp_path / "dense.h5ad"
    x = np.arange(60, dtype=np.float32).reshape(12, 5)
    adata = anndata.AnnData(X=x)
    adata.obsm["X_pca"] = x[:, :2] * 2
    adata.write_h5ad(path)
    with HDF5SessionDataset([path], key="X") as ds:
        assert np.array_equal(ds[3], x[3])
    with HDF5SessionDataset([path], key="obsm/X_pca") as ds:
        assert np.array_equal(ds[3], x[3, :2] * 2)
    with pytest.raises(ConfigError, match="dense"):
        HDF5SessionDataset([path], key="X", sparse="dense")


# ------------------------------------------------------------------ refused and damaged


def test_csc_and_var_mismatch_are_refused_by_name(tmp_path: Path) -> None:
    csc = tmp_path / "csc.h5ad"
    anndata.AnnData(X=sp.random(20, 50, 0.3, "csc", np.float32)).write_h5ad(csc)
    with pytest.raises(ConfigError, match=r"CSC.*tocsr"):
        HDF5SessionDataset([csc], key="X")
    a = write_current(tmp_path / "a.h5ad", matrix(0))
    b = tmp_path / "b.h5ad"
    other = anndata.read_h5ad(a)
    other.var_names = ["x" + n if n == "gene9" else n for n in GENE_NAMES]
    other.write_h5ad(b)
    twin = tmp_path / "twin.h5ad"
    twin.write_bytes(a.read_bytes())
    with pytest.raises(ConfigError, match=rf"{b}.*position 9 holds 'xgene9'.*join="):
        HDF5SessionDataset([a, twin, b], key="X")
    fewer = write_current(tmp_path / "c.h5ad", matrix(0, genes=40))
    with pytest.raises(ConfigError, match="40 genes where the first file has 50"):
        HDF5SessionDataset([a, fewer], key="X")


def _damaged(tmp_path: Path, name: str) -> Path:
    path = write_legacy(tmp_path / f"{name}.h5ad", matrix(0), compression=None)
    return path


def test_damaged_indptr_and_lengths_fail_at_construction(tmp_path: Path) -> None:
    path = _damaged(tmp_path, "down")
    with h5py.File(path, "r+") as f:
        f["X/indptr"][5] = f["X/indptr"][7]  # indptr[5] > indptr[6]
    with pytest.raises(HDF5FileError, match=rf"{path}.*row 5 ends before it starts"):
        HDF5SessionDataset([path], key="X")
    path = _damaged(tmp_path, "past")
    with h5py.File(path, "r+") as f:
        f["X/indptr"][-1] = f["X/data"].shape[0] + 5
    with pytest.raises(HDF5FileError, match=r"row 199 ends at \d+, past the"):
        HDF5SessionDataset([path], key="X")
    path = _damaged(tmp_path, "lengths")
    with h5py.File(path, "r+") as f:
        indices = f["X/indices"][:-1]
        del f["X/indices"]
        f["X/indices"] = indices
    with pytest.raises(HDF5FileError, match="values but 'indices'"):
        HDF5SessionDataset([path], key="X")


def test_column_ids_out_of_range_fail_at_the_read(tmp_path: Path) -> None:
    path = _damaged(tmp_path, "cols")
    m = matrix(0)
    with h5py.File(path, "r+") as f:
        f["X/indices"][m.indptr[30] + 1] = 50
    with HDF5SessionDataset([path], key="X") as ds:
        assert ds[29].shape == (50,)  # other rows still read
        with pytest.raises(HDF5FileError, match=r"row 30 holds column id 50, outside 0..49"):
            ds.__getitems__([10, 30, 31])
        with pytest.raises(HDF5FileError, match="row 30"):
            ds[30]
    with h5py.File(path, "r+") as f:
        f["X/indices"][m.indptr[30] + 1] = 3
        f["X/indices"][m.indptr[40]] = -2  # negative: as far outside as a large id
    with HDF5SessionDataset([path], key="X") as ds:
        ds.__getitems__([10, 30, 31])
        with pytest.raises(HDF5FileError, match=r"row 40 holds column id -2, outside 0..49"):
            ds.__getitems__([40, 10])


def test_truncated_file_is_an_error_never_a_short_row(tmp_path: Path) -> None:
    path = _damaged(tmp_path, "cut")
    with HDF5SessionDataset([path], key="X") as ds:
        size = os.path.getsize(path)
        with h5py.File(path, "r") as f:
            end = f["X/data"].id.get_offset()  # cut inside the values
        os.truncate(path, min(size - 1, end + 40))
        with pytest.raises(HDF5FileError):
            ds.__getitems__(list(range(150, 200)))


def test_block_order_cuts_cells_by_the_block_size_not_by_value_chunks(
    corpus: tuple[list[Path], np.ndarray],
) -> None:
    """A chunk of ``data`` holds values, not rows: blocks are the sampler's rows alone."""
    from loaderkit.hdf5 import DEFAULT_BLOCK_SIZE

    paths, _ = corpus
    with HDF5SessionDataset(paths, key="X") as ds:
        index = ds.loader_support().session_index()
        assert index.chunk_rows.tolist() == [1] * len(paths)
        order = np.array(list(BlockShuffleSampler(ds, seed=0)))
        pos, rows = index.positions[order], index.rows[order]
        starts = np.flatnonzero((pos[1:] != pos[:-1]) | (rows[1:] - rows[:-1] != 1)) + 1
        runs = np.diff(np.concatenate(([0], starts, [order.size])))
        assert runs.max() < 8 * DEFAULT_BLOCK_SIZE  # shuffled blocks, not whole sessions


@pytest.mark.parametrize("chunks", [7, None])  # 7: spans cross chunk bounds; None: contiguous
def test_spans_read_raw_in_pieces_equal_the_rows(tmp_path: Path, chunks: int | None) -> None:
    """Every batch after the first reads its spans raw, one ``preadv`` a piece: same rows."""
    m = matrix(5)
    path = write_csr(tmp_path / "pieces.h5ad", m, chunks)
    truth = m.toarray()
    with HDF5SessionDataset([path], key="X") as ds:
        for _ in range(2):  # the first pass builds the chunk index, the second reads raw
            order = np.random.default_rng(0).permutation(len(ds))
            for start in range(0, order.size, 32):
                picked = order[start : start + 32].tolist()
                got = np.stack([row.to_dense().numpy() for row in ds.__getitems__(picked)])
                assert np.array_equal(got, truth[picked])


def test_sparse_batches_cross_in_the_workers_slots_and_torch_never_warns(
    corpus: tuple[list[Path], np.ndarray],
) -> None:
    """A CSR batch travels as its three parts in a slot and is made again on arrival."""
    paths, _ = corpus
    with HDF5SessionDataset(paths, key="X") as ds:
        alone = _epoch(ds, shuffle=True, num_workers=0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with create_dataloader(
                ds,
                batch_size=64,
                seed=3,
                shuffle=True,
                num_workers=2,
                multiprocessing_context="fork",
            ) as loader:
                got = list(loader)
                stats = loader.handoff_stats()
        assert all(b.layout == torch.sparse_csr for b in got)
        assert all(np.array_equal(a, dense(b)) for a, b in zip(alone, got, strict=True))
        assert stats.path == "slots" and stats.pooled == stats.batches == len(got)
        assert not [w for w in caught if "invariant" in str(w.message)]


def test_column_ids_stored_out_of_order_are_served_increasing(tmp_path: Path) -> None:
    """Rows stored with descending column ids (scanpy's pbmc68k), and genes= out of order."""
    m = matrix(4)
    rows = [m.indices[a:b][::-1] for a, b in zip(m.indptr[:-1], m.indptr[1:], strict=True)]
    vals = [m.data[a:b][::-1] for a, b in zip(m.indptr[:-1], m.indptr[1:], strict=True)]
    stored = (np.concatenate(vals), np.concatenate(rows))
    path = write_csr(tmp_path / "descending.h5ad", m, rows=stored, var=True)
    truth = m.toarray()
    picked = [GENE_NAMES[i] for i in (30, 2, 17, 5)]  # renumbered out of the file's order
    for genes, want in ((None, truth), (picked, truth[:, [30, 2, 17, 5]])):
        with HDF5SessionDataset([path], key="X", genes=genes) as ds:
            for batch in DataLoader(ds, batch_size=64, shuffle=True, seed=0):
                parts = (batch.crow_indices(), batch.col_indices(), batch.values())
                torch.sparse_csr_tensor(*parts, batch.shape, check_invariants=True)
            got = next(iter(DataLoader(ds, batch_size=len(ds))))
            assert np.array_equal(got.to_dense().numpy(), want)
        with HDF5SessionDataset([path], key="X", genes=genes, sparse="tokens") as ds:
            for i in range(0, len(ds), 37):
                genes_of_row = ds[i]["genes"].numpy()
                assert np.all(np.diff(genes_of_row) > 0)
                assert np.array_equal(ds[i]["values"].numpy(), want[i][genes_of_row])


def test_open_file_budget_counts_a_chunk_buffer_only_for_compressed_matrices(
    tmp_path: Path,
) -> None:
    """Uncompressed values and column ids are read raw: no chunk buffer fills per open file."""
    from loaderkit.policy.budgets import FILE_OVERHEAD_BYTES

    plain = [write_current(tmp_path / f"p{i}.h5ad", matrix(i)) for i in range(3)]
    packed = [write_current(tmp_path / f"z{i}.h5ad", matrix(i), compression="gzip") for i in (0, 1)]
    with HDF5SessionDataset(plain, key="X") as ds:
        assert ds.budgets.file_memory_bytes == FILE_OVERHEAD_BYTES
    with HDF5SessionDataset(
        [*plain, *packed], key="X", h5py_options={"rdcc_nbytes": 4 << 20}
    ) as ds:
        assert ds.budgets.file_memory_bytes == FILE_OVERHEAD_BYTES + (4 << 20)


def test_a_shuffled_loader_gives_a_compressed_matrix_room_for_all_its_decoded_chunks(
    tmp_path: Path,
) -> None:
    """Shuffled cells of a gzip matrix decode each chunk once: the chunk buffer holds them all."""
    from loaderkit.support import LoaderShape

    big = sp.random(6000, 4000, density=0.05, format="csr", dtype=np.float32, random_state=3)
    big.data = np.ceil(big.data * 10).astype(np.float32)
    path = tmp_path / "big.h5ad"
    anndata.AnnData(X=big).write_h5ad(path, compression="gzip")
    plain = write_current(tmp_path / "plain.h5ad", matrix(0))
    size = big.nnz * 8  # float32 values and int32 column ids, decoded
    with HDF5SessionDataset([path], key="X") as ds:
        built = ds.handles.reader.files.open_kwargs[0]["rdcc_nbytes"]
        assert built < size
        with create_dataloader(ds, batch_size=500, shuffle=True, seed=1) as loader:
            plan = " ".join(loader.describe().split())  # reasons wrap
            rows = np.concatenate([dense(b) for b in loader])
        assert f"chunk_buffer unset {size}" in plan
        # no node cache here: "cache" names nothing else of loaderkit (the OS's page cache aside)
        assert "cache" not in plan.replace("page cache", "")
        assert "decodes each chunk of the compressed matrix once" in plan
        assert ds.handles.reader.files.open_kwargs[0]["rdcc_nbytes"] == size
        assert np.array_equal(np.sort(rows, axis=0), np.sort(big.toarray(), axis=0))
        with create_dataloader(ds, batch_size=500, shuffle="block", seed=1) as loader:
            assert "chunk_buffer" not in loader.describe()
        assert ds.handles.reader.files.open_kwargs[0]["rdcc_nbytes"] == built  # as it was built
        tight = LoaderShape(2, memory_bytes=64 << 20, uniform_shuffle=True)
        refused = ds.budgets.fit_chunk_buffer(tight, given=False)
        assert (
            refused is not None
            and refused.value == built
            and "exceed 0.0625 of memory" in refused.reason
        )
    with HDF5SessionDataset([path], key="X", h5py_options={"rdcc_nbytes": 1 << 20}) as ds:
        with create_dataloader(ds, batch_size=500, shuffle=True, seed=1) as loader:
            assert "rdcc_nbytes as given in h5py_options" in " ".join(loader.describe().split())
        assert ds.handles.reader.files.open_kwargs[0]["rdcc_nbytes"] == 1 << 20
    with HDF5SessionDataset([plain], key="X") as ds:  # uncompressed: read raw, no buffer
        with create_dataloader(ds, batch_size=50, shuffle=True, seed=1) as loader:
            assert "chunk_buffer" not in loader.describe()
