"""``csrplan``: the catalog of spans and chunk tables, and the pieces a batch is read in.

``plan_pieces`` is checked against a file built in memory: chunks of known contents placed
in a shuffled order (some back to back, as HDF5 writes them), runs drawn at random, and the
bytes each planned read names compared with the elements each run asks for.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from loaderkit import HDF5SessionDataset
from loaderkit.hdf5.anndata.csrmatrix import CSRMatrix
from loaderkit.hdf5.anndata.csrplan import (
    AROUND,
    CONTIGUOUS,
    SpanCatalog,
    batch_sessions,
    plan_pieces,
    read_around,
)
from loaderkit.hdf5.read import uring
from tests.hdf5.h5adfiles import matrix, write_csr


def _file(rng: np.random.Generator, elements: int, size: int) -> tuple[bytes, np.ndarray]:
    """A 'file' holding ``elements`` int32 values 0.. in chunks of ``size``, some out of order."""
    values = np.arange(elements, dtype=np.int32)
    count = -(-elements // size)
    order = np.arange(count)
    swap = rng.choice(count, count // 3, replace=False)  # a third of the chunks moved
    order[swap] = rng.permutation(order[swap])
    blob, offsets, at = bytearray(b"\xff" * 16), np.empty(count, np.int64), 16
    for c in order.tolist():
        chunk = values[c * size : (c + 1) * size]
        offsets[c] = at
        blob += chunk.tobytes() + bytes((size - chunk.size) * 4)
        at += size * 4
    return bytes(blob), offsets


@pytest.mark.parametrize("size", [1, 7, 64, CONTIGUOUS])
def test_planned_reads_fetch_exactly_the_runs(size: int) -> None:
    rng = np.random.default_rng(size % 1000)
    elements = 500
    if size == CONTIGUOUS:
        blob, tables = bytes(8) + np.arange(elements, dtype=np.int32).tobytes(), np.array([8])
    else:
        blob, tables = _file(rng, elements, size)
    starts = rng.integers(0, elements - 40, 30)
    lengths = rng.integers(1, 40, 30)
    at = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    elems = np.full(30, size, np.int64)
    where, into, nbytes, run = plan_pieces(
        elems, np.zeros(30, np.int64), tables, starts, lengths, at, 4
    )
    out = np.full(int(lengths.sum()), -1, np.int32)
    flat = out.view(np.uint8)
    for w, o, b in zip(where.tolist(), into.tolist(), nbytes.tolist(), strict=True):
        flat[o : o + b] = np.frombuffer(blob[w : w + b], np.uint8)
    want = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths, strict=True)])
    assert np.array_equal(out, want)
    assert np.array_equal(np.bincount(run, nbytes, minlength=30), lengths * 4)
    if size not in (1, CONTIGUOUS):  # runs crossing chunks laid back to back: joined reads
        assert where.size < sum(
            -(-(s + n) // size) - s // size for s, n in zip(starts, lengths, strict=True)
        )


def test_a_chunk_never_written_is_marked() -> None:
    where, *_ = plan_pieces(
        np.array([4, 4]),
        np.array([0, 0]),
        np.array([100, -1]),
        np.array([0, 5]),
        np.array([2, 2]),
        np.array([0, 2]),
        4,
    )
    assert where.tolist() == [100, -1]


def test_the_catalog_holds_sessions_as_they_come() -> None:
    catalog = SpanCatalog([3, 2, 4])
    assert not catalog.known(np.array([0]))
    held = catalog.hold_indptr(2, np.array([0, 1, 1, 5, 9]))
    assert not held.flags.writeable and catalog.indptr(0) is None
    catalog.hold_indptr(0, np.array([0, 2, 2, 6]))
    begin, end = catalog.spans(np.array([2, 0, 2]), np.array([2, 2, 0]))
    assert (begin.tolist(), end.tolist()) == ([1, 2, 0], [5, 6, 1])
    for pos in range(3):  # the table array grows; what was held stays
        catalog.hold_tables(pos, [(8, np.arange(700) + pos), (CONTIGUOUS, np.array([pos]))])
    assert catalog.known(np.array([0, 2]))
    assert not catalog.known(np.array([0, 1]))  # session 1's tables, not its indptr
    catalog.hold_indptr(1, np.array([0, 1, 3]))
    catalog.hold_indptr(1, np.array([0, 1, 3]))  # again: nothing changes
    assert catalog.known(np.array([1])) and not catalog._unknown  # every session: no look-up
    elems, bases, tables = catalog.table(0, np.array([1, 2]))
    assert elems.tolist() == [8, 8] and tables[bases].tolist() == [1, 2]
    elems, bases, tables = catalog.table(1, np.array([2]))
    assert elems.tolist() == [CONTIGUOUS] and tables[bases].tolist() == [2]


def test_reading_around_is_chosen_by_whether_the_files_fit_in_memory() -> None:
    assert read_around(100 << 20, 8 << 30)[0] == AROUND
    assert read_around(4 << 30, 8 << 30)[0] == 0
    around, why = read_around(1 << 20, None)
    assert around == 0 and "memory unknown" in why


def _reads(ds: HDF5SessionDataset) -> tuple[list[int], list[int]]:
    """Tables of pieces read, and runs decoded one by one, from now on (``_read_table``,
    ``_span``): what ``CSRMatrix._read``'s one plan did with each batch."""
    reader = ds.handles.reader.matrix  # the AnnData reader's matrix part
    assert isinstance(reader, CSRMatrix)
    tables: list[int] = []
    decoded: list[int] = []
    read_table, span = reader._read_table, reader._span

    def table_spy(out: np.ndarray, table: np.ndarray) -> bool:
        tables.append(len(table))
        return read_table(out, table)

    def span_spy(*args: object) -> None:
        decoded.append(1)
        span(*args)  # type: ignore[arg-type]

    reader._read_table = table_spy  # type: ignore[method-assign]
    reader._span = span_spy  # type: ignore[method-assign]
    return tables, decoded


@pytest.mark.parametrize("chunks", [7, None])  # 7: spans cross chunk bounds; None: contiguous
def test_every_batch_is_one_table_planned_from_the_catalog_the_first_too(
    tmp_path: Path, chunks: int | None
) -> None:
    m = matrix(3)
    paths = []
    for s in range(2):
        paths.append(write_csr(tmp_path / f"s{s}.h5ad", m, chunks))
    truth = np.concatenate([m.toarray()] * 2)
    with HDF5SessionDataset(paths, key="X") as ds:
        tables, decoded = _reads(ds)
        order = np.random.default_rng(1).permutation(len(ds))
        for start in range(0, order.size, 48):
            picked = order[start : start + 48].tolist()
            got = np.stack([row.to_dense().numpy() for row in ds.__getitems__(picked)])
            assert np.array_equal(got, truth[picked])
        # the catalog learns a batch's sessions before it is planned: every batch one table
        assert len(tables) == -(-order.size // 48) and not decoded
        assert "KiB read around a missed row" in ds.handles.io_paths()["X"].reason


def test_compressed_sessions_are_decoded_run_by_run_beside_planned_ones(tmp_path: Path) -> None:
    """A session whose chunks are compressed is decoded (in file order); the raw one beside it
    in the same batch is still one table."""
    m = matrix(4)
    raw = write_csr(tmp_path / "raw.h5ad", m, 7)
    packed = tmp_path / "packed.h5ad"
    with h5py.File(packed, "w") as f:
        group = f.create_group("X")
        group.attrs["encoding-type"] = "csr_matrix"
        group.attrs["encoding-version"] = "0.1.0"
        group.attrs["shape"] = np.array(m.shape)
        group.create_dataset("data", data=m.data, chunks=(7,), compression="gzip")
        group.create_dataset("indices", data=m.indices, chunks=(7,), compression="gzip")
        group.create_dataset("indptr", data=m.indptr)
    truth = np.concatenate([m.toarray()] * 2)
    with HDF5SessionDataset([raw, packed], key="X") as ds:
        tables, decoded = _reads(ds)
        order = np.random.default_rng(3).permutation(len(ds))
        for start in range(0, order.size, 32):
            picked = order[start : start + 32].tolist()
            got = np.stack([row.to_dense().numpy() for row in ds.__getitems__(picked)])
            assert np.array_equal(got, truth[picked])
        assert tables and decoded  # both cases of the one plan


def test_a_batch_over_more_sessions_than_open_files_is_read_session_by_session(
    tmp_path: Path,
) -> None:
    m = matrix(5)
    paths = [write_csr(tmp_path / f"f{s}.h5ad", m, 7) for s in range(5)]
    truth = np.concatenate([m.toarray()] * 5)
    with HDF5SessionDataset(paths, key="X", max_open_files=2) as ds:
        tables, decoded = _reads(ds)
        picked = np.random.default_rng(5).permutation(len(ds))[:64].tolist()
        got = np.stack([row.to_dense().numpy() for row in ds.__getitems__(picked)])
        assert np.array_equal(got, truth[picked])
        assert len(tables) == 5 and not decoded  # a table a session, each leased in turn
        assert ds.handles.open_files <= 2


def test_rows_across_one_chunk_end_are_one_read_where_the_chunks_lie_back_to_back() -> None:
    """800-value rows in 15,625-value chunks cross a chunk's end now and then: one read each
    where the next chunk follows in the file, two where it lies elsewhere."""
    item, size = 4, 10
    tables = np.array([100, 140, 500, 180, -1], np.int64)  # 0,1 back to back; 1,2 not; 4 unwritten
    elems, bases = np.full(3, size), np.zeros(3, np.int64)
    starts, lengths, at = np.array([8, 2, 35]), np.array([4, 3, 2]), np.array([0, 4, 7])
    where, into, nbytes, run = plan_pieces(elems, bases, tables, starts, lengths, at, item)
    assert where.tolist() == [132, 108, 200] and nbytes.tolist() == [16, 12, 8]  # run 0: one read
    assert into.tolist() == [0, 16, 28] and run.tolist() == [0, 1, 2]
    starts = np.array([8, 18, 2])  # run 1 crosses from chunk 1 to chunk 2, which lies elsewhere
    where, into, nbytes, run = plan_pieces(elems, bases, tables, starts, lengths, at, item)
    assert where.tolist() == [132, 172, 500, 108] and nbytes.tolist() == [16, 8, 4, 8]
    assert run.tolist() == [0, 1, 1, 2]
    starts = np.array([8, 38, 2])  # run 1 crosses into a chunk never written: -1
    where, _, nbytes, run = plan_pieces(elems, bases, tables, starts, lengths, at, item)
    assert where.tolist() == [132, 212, -1, 108] and run.tolist() == [0, 1, 1, 2]


def test_while_another_thread_reads_a_batch_goes_through_the_ring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another thread inside a read (``reading``): the pieces go to one ring call, same rows."""
    if uring.thread_ring() is None:
        pytest.skip("no io_uring here")
    m = matrix(6)
    paths = [write_csr(tmp_path / f"r{s}.h5ad", m, 7) for s in range(2)]
    calls: list[int] = []
    original = uring.Ring.read_table

    def counted(ring: uring.Ring, flat: np.ndarray, table: np.ndarray) -> np.ndarray:
        calls.append(len(table))
        return original(ring, flat, table)

    monkeypatch.setattr(uring.Ring, "read_table", counted)
    truth = np.concatenate([m.toarray()] * 2)
    with HDF5SessionDataset(paths, key="X") as ds:
        reader = ds.handles.reader.matrix  # the CSR matrix part
        ds.__getitems__(list(range(0, len(ds), 5)))  # the catalog filled: both files
        reader.reading.append(None)  # as if another thread were reading
        try:
            order = np.random.default_rng(2).permutation(len(ds))
            for start in range(0, order.size, 48):
                picked = order[start : start + 48].tolist()
                got = np.stack([row.to_dense().numpy() for row in ds.__getitems__(picked)])
                assert np.array_equal(got, truth[picked])
        finally:
            reader.reading.pop()
    batches = -(-len(truth) // 48)
    assert len(calls) == batches and max(calls) > 80  # both keys' pieces: one call a batch


@pytest.mark.parametrize("sessions", [5, 100_000])  # marks per session / np.unique
def test_batch_sessions_are_the_distinct_sessions_and_each_rows_place(sessions: int) -> None:
    rng = np.random.default_rng(sessions)
    cpos = rng.integers(0, min(sessions, 50), 64)
    distinct, slot = batch_sessions(cpos, sessions)
    assert distinct.tolist() == sorted(set(cpos.tolist()))
    assert np.array_equal(distinct[slot], cpos)


def test_batches_over_more_files_than_stay_open_are_planned(tmp_path: Path) -> None:
    """30 files, 6 kept open, batches of 5 cells: a batch's closed files are opened for it."""
    ms = [matrix(s, cells=20) for s in range(30)]
    paths = [write_csr(tmp_path / f"s{s}.h5ad", m, 7) for s, m in enumerate(ms)]
    truth = np.concatenate([m.toarray() for m in ms])
    with HDF5SessionDataset(paths, key="X", max_open_files=6) as ds:
        tables, decoded = _reads(ds)
        for epoch in range(2):
            order = np.random.default_rng(epoch).permutation(len(ds))
            for start in range(0, order.size, 5):
                picked = order[start : start + 5].tolist()
                got = np.stack([row.to_dense().numpy() for row in ds.__getitems__(picked)])
                assert np.array_equal(got, truth[picked])
            assert ds.handles.file_pool_info().open_files <= 6
        # every batch one table (its closed files opened for it), none decoded
        assert len(tables) == 2 * -(-len(ds) // 5) and not decoded
