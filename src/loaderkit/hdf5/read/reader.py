"""``SessionReader``: reads rows of one or several keys from session files, and checks them.

The reader owns what reading needs: the per-process file pool, how each key is stored
(``KeySpec``) and typed (``RowType``), what every session file held when the index was built
(``SessionRecord``), and the error context. ``HDF5SessionDataset`` keeps its hooks, accessors
and pickling, and hands its default reads here:

* ``read_one`` — one sample (per-item reads);
* ``read_batch`` — a batch grouped into runs of consecutive rows (``runs.plan_runs``),
  every key read into one buffer: a table of reads (``readtable.read_table``) or a memory map
  for contiguous numbers (other byte orders into a reused scratch buffer, converted while
  copied), HDF5 otherwise (which converts byte order, enums and compounds itself), then split
  into samples and the collated batch (``loaderkit.workers.collate.RowBatch``).

Keys whose rows span many chunks that other rows share (``SessionLayout.shares_chunks``:
NSD's ``(750, V)`` betas with chunks ``(750, 1)``) are read apart (``widekeys``, with
``widerows``): a batch's rows of one session in one pass over that session's chunks, and whole
sessions held in memory within ``max_session_bytes`` (``heldsessions``), so that block order
reads each session once.

Never silently wrong: a file is compared with its ``SessionRecord`` when it is (re)opened, and
with its identity at open (one ``fstat``) after every read and before every copy out of a
memory map, so a file rewritten, shrunk or truncated under the dataset is an
``HDF5FileError`` naming what changed, never another dataset's bytes or zero rows.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from loaderkit.errors import ConfigError
from loaderkit.hdf5.meta.index import ROW_BITS, ROW_MASK
from loaderkit.hdf5.meta.keyspecs import KeySpec, SessionRecord, axis_selection, read_slab
from loaderkit.hdf5.meta.types import Kind, RowType, Samples, dict_rows
from loaderkit.hdf5.read.handles import Handle
from loaderkit.hdf5.read.labelkeys import served_parts, served_values
from loaderkit.hdf5.read.rawio import pread
from loaderkit.hdf5.read.readtable import RING_MIN_READS, ShortRead, Table, read_table
from loaderkit.hdf5.read.runs import plan_runs
from loaderkit.hdf5.read.sessionfiles import SessionFiles
from loaderkit.hdf5.read.widekeys import fill_wide, read_wide
from loaderkit.workers.collate import RowBatch, batch_buffer

__all__ = ["KeySpec", "SessionReader", "SessionRecord"]


class SessionReader(SessionFiles):
    """Default reads of ``HDF5SessionDataset``: one sample, a batch, runs through a hook.

    Built with the arguments of its base, ``loaderkit.hdf5.read.sessionfiles.SessionFiles``
    (keys, types, records, handles and checks); keys whose rows span many chunks are read by
    the functions of ``loaderkit.hdf5.read.widekeys`` over that state.

    Example:
        >>> SessionReader.read_one.__name__
        'read_one'
    """

    def close(self) -> None:
        """Close this process's open files and drop the sessions held in memory."""
        if self.__dict__.get("file_pool") is not None:
            self.file_pool.close()
        if self.__dict__.get("held") is not None:
            self.held.clear()

    def session_rows(self) -> list[int]:
        """Samples per session the default ``build_index`` counts: rows of the first key."""
        return [rec.layouts[0].rows if rec.layouts else 0 for rec in self.records]

    def chunk_rows(self) -> list[int]:
        """Rows per storage chunk of each session (1: contiguous): where blocks are cut."""
        return [(rec.layouts[0].chunk_rows or 1) if rec.layouts else 1 for rec in self.records]

    def threads_reading(self) -> int:
        """How many threads are inside a batch read of this reader now (this one included)."""
        return len(self.reading)

    def read_one(self, index: int, pos: int, row: int) -> Any:
        """Sample ``index`` (session ``pos``, ``row``) as the default ``read`` returns it.

        Raises:
            ConfigError: The rows have no torch type (``type_error``), raised at this call.
        """
        if self.type_error is not None:
            raise ConfigError(str(self.type_error))
        values = self.read_keys(index, pos, row, range(len(self.specs)))
        if self.single:
            return values[0]
        return {spec.name: value for spec, value in zip(self.specs, values, strict=True)}

    def read_keys(self, index: int, pos: int, row: int, keys: Sequence[int]) -> list[Any]:
        """Row ``row`` of session ``pos`` of each key in ``keys`` as served; errors name the row.

        The handle is leased for the read, unless this thread holds the hook lock (a subclass's
        ``read`` calling ``super().read()``): no handle is closed under it.
        """
        locked = self.file_pool.lock.held()
        handle = self.handle(pos, row, index) if locked else self.leased(pos, row, index)
        try:
            values = [self._one(handle, k, pos, row, index) for k in keys]
            if handle.watch:
                self.verify(handle, pos, f"row {row}", index)
        except MemoryError:
            raise
        except Exception as exc:
            raise self.read_error(exc, pos, range(row, row + 1), index) from exc
        finally:
            if not locked:
                self.file_pool.release(handle)
        return served_values(self.served, keys, values, (pos, row), self.ids, self.paths)

    def _one(self, handle: Handle, k: int, pos: int, row: int, index: int) -> Any:
        rt = self.types[k]
        if self._some_wide and self.wide[pos][k]:  # a row touches every chunk: held, or a pass
            sample = np.empty((1, *rt.row_shape), rt.mem_dtype)
            read_wide(self, k, pos, np.array([row], np.int64), sample, index)
            return sample[0] if rt.row_shape else sample[0][()]
        raw, mapped = handle.raws[k], handle.maps[k]
        if raw is not None:
            sample = np.empty(rt.row_shape, rt.read_dtype)
            if mapped is not None:
                self.verify(handle, pos, f"row {row}", index)  # never fault on a truncated map
                sample[...] = mapped[row]  # a copy, never a view of the map
            else:
                pread(raw, row * self.row_bytes[k], sample, self.row_bytes[k])
            if rt.kind is Kind.STRUCT:
                return rt.sample(sample[()] if not rt.row_shape else sample)
            if rt.swap:
                sample = sample.astype(rt.mem_dtype)
            return sample if rt.row_shape else sample[()]
        if handle.chunked[k] is not None and rt.kind is Kind.NUMBER:  # raw chunks, no lock
            rows = np.empty((1, *rt.row_shape), rt.read_dtype)
            self.fill_run(handle, k, pos, row, 1, rows, index)
            if rt.swap:
                rows = rows.astype(rt.mem_dtype)
            return rows[0] if rt.row_shape else rows[0][()]
        spec = self.specs[k]
        if spec.members:
            return rt.sample(self._member(handle, k, pos, row))
        dset = handle.datasets[k]
        if rt.kind is Kind.NUMBER:
            value = dset[axis_selection(spec.axis, row, None)] if spec.axis else dset[row]
            if isinstance(value, np.ndarray):
                return value.astype(rt.mem_dtype, copy=False)
            return np.asarray(value).astype(rt.mem_dtype)[()]
        if rt.kind is Kind.STRUCT:
            slab = read_slab(dset, spec.axis, row, 1, rt.read_dtype)
            return rt.sample(np.moveaxis(slab, spec.axis, 0)[0])
        value = dset[axis_selection(spec.axis, row, None)] if spec.axis else dset[row]
        return rt.sample(value)

    def read_batch(self, idx: np.ndarray, keys: np.ndarray) -> RowBatch:
        """Read the samples of ``keys`` (dataset indices ``idx``), every key into one buffer.

        Returns:
            A ``RowBatch``: the samples in request order, and the collated batch.
        """
        n = idx.size
        order, starts = plan_runs(keys, sort=self.chunked, always=self.contiguous)
        if starts is None:
            starts = np.arange(n)
        reading = self.reading
        reading.append(None)  # threads reading now: ``_fill`` chooses its system calls by it
        try:
            parts = [self._read_key(k, idx, keys, order, starts) for k in range(len(self.specs))]
        finally:
            reading.pop()
        parts = served_parts(self.served, parts, keys, self.ids, self.paths)  # anndata columns
        if self.single:  # the rows (views of the batch, or dicts) only when something asks
            return RowBatch(parts[0][1], parts[0][0], ragged=self._ragged_names[0])
        names = [spec.name for spec in self.specs]
        batch = {name: part[1] for name, part in zip(names, parts, strict=True)}
        ragged = next((self._ragged_names[k] for k, p in enumerate(parts) if p[1] is None), None)
        rows = functools.partial(dict_rows, names, [part[0] for part in parts])
        return RowBatch(None if ragged else batch, rows, ragged=ragged)

    def _scratch(self, n: int, rt: RowType) -> np.ndarray:
        """A reused buffer of ``n`` rows as stored (``read_dtype``); never handed out.

        Rows that need converting (another byte order, records split into fields) are read
        here and copied out, so the batch costs no fresh allocation and page faults twice.
        """
        local = self.scratch  # one buffer per thread: threads read batches at once
        views: dict[tuple[int, np.dtype, tuple[int, ...]], np.ndarray] | None = getattr(
            local, "views", None
        )
        if views is None:
            views = local.views = {}
            local.spare = None
        view = views.get((n, rt.read_dtype, rt.row_shape))
        if view is not None:
            return view
        shape = (n, *rt.row_shape)
        nbytes = math.prod(shape) * rt.read_dtype.itemsize
        if local.spare is None or local.spare.nbytes < nbytes:
            local.spare = np.empty(max(nbytes, 1 << 16), np.uint8)
            views.clear()  # views of the buffer replaced
        if len(views) >= 16:  # batches of many sizes: keep the views bounded
            views.clear()
        view = local.spare[:nbytes].view(rt.read_dtype).reshape(shape)
        views[n, rt.read_dtype, rt.row_shape] = view
        return view

    def _read_key(
        self,
        k: int,
        idx: np.ndarray,
        keys: np.ndarray,
        order: np.ndarray | None,
        starts: np.ndarray,
    ) -> tuple[Samples, Any]:
        rt = self.types[k]
        n = idx.size
        if rt.kind is Kind.NUMBER and not self.specs[k].members:
            tensor, out = batch_buffer(n, rt.row_shape, rt.mem_dtype)
            stored = self._scratch(n, rt) if rt.swap else out
            if not (self.memory_map and self.contiguous and self._mapped(k, idx, keys, stored)):
                self._fill(k, idx, keys, order, starts, stored)
            if stored is not out:
                np.copyto(out, stored)  # to native byte order while copying
            return functools.partial(list, out), tensor
        if k in self.uneven:
            out = np.empty(n, object)
        elif rt.record is not None:  # split into fresh per-field batches: the records are scratch
            out = self._scratch(n, rt)
        else:
            out = np.empty((n, *rt.row_shape), rt.read_dtype)
        self._fill(k, idx, keys, order, starts, out)
        if k in self.uneven:  # per-sample datasets of differing shapes: never stacked
            return functools.partial(list, [rt.sample(v) for v in out]), None
        return rt.batch(out, batch_buffer)

    def _mapped(self, k: int, idx: np.ndarray, keys: np.ndarray, out: np.ndarray) -> bool:
        """Gather a batch from memory maps with one ``np.take`` per session.

        Block-shuffled batches come in a few stretches of one session each: each stretch is
        taken straight into ``out``. Where sessions interleave (uniform shuffling), the rows are
        taken session by session into a scratch batch and put in request order with one
        scatter. Either way the batch is copied at memory speed by a handful of C calls that
        release the GIL (threads copy in parallel). Returns ``False`` (nothing read) when a
        session is not mapped. The file is checked (``verify``) before every copy: a truncated
        file is an error, not ``SIGBUS``.
        """
        n = keys.shape[0]
        pos = keys >> ROW_BITS
        cuts = np.flatnonzero(pos[1:] != pos[:-1]) + 1
        order: np.ndarray | None = None
        target = out
        if (cuts.size + 1) * 4 > n:  # interleaved sessions: gather by session, then scatter
            order = np.argsort(pos, kind="stable")
            keys, idx, pos = keys[order], idx[order], pos[order]
            cuts = np.flatnonzero(pos[1:] != pos[:-1]) + 1
            rt = self.types[k]  # the thread's scratch, unless ``out`` is that scratch already
            target = np.empty_like(out) if rt.swap else self._scratch(n, rt)
        rows = keys & ROW_MASK
        starts = np.concatenate(([0], cuts))
        bounds = [*starts.tolist(), n]
        checked: set[int] = set()
        for s, p in enumerate(pos[starts].tolist()):
            k0, k1 = bounds[s], bounds[s + 1]
            handle = self.leased(p, int(rows[k0]), int(idx[k0]))
            try:
                mapped = handle.maps[k]
                if mapped is None:
                    return False  # not mapped (any more): _fill reads the whole batch again
                if p not in checked:  # never fault on a truncated map: once per file and batch
                    self.verify(handle, p, "rows", int(idx[k0]))
                    checked.add(p)
                segment = target[k0:k1]
                # rows were checked against the file when it was opened (its record);
                # mode="clip" because numpy buffers ``out`` for mode="raise"
                np.take(mapped, rows[k0:k1], axis=0, out=segment, mode="clip")
            finally:
                mapped = None  # no view left: a retired handle's map closes at release
                self.file_pool.release(handle)
        if order is not None:
            out[order] = target
        return True

    def _fill(
        self,
        k: int,
        idx: np.ndarray,
        keys: np.ndarray,
        order: np.ndarray | None,
        starts: np.ndarray,
        out: np.ndarray,
    ) -> None:
        """Read the runs of ``keys`` for key ``k`` into ``out`` (request order)."""
        if self.any_wide[k]:
            fill_wide(self, k, idx, keys, out)
            return
        n = idx.size
        buf = out if order is None else np.empty_like(out)
        # reads take the rows as bytes: exporting a record dtype's buffer is slow
        plain = buf.dtype.names is None or buf.dtype.hasobject  # objects: never read raw
        rows = buf if plain else buf.view(np.uint8).reshape(n, -1)
        # Contiguous data: the runs are a table of reads (``read_table``). With other threads
        # reading at once, every system call releases the GIL, a hand-over to another thread:
        # the table then goes to a ring or takes turns (``shared``).
        shared = self.threads_reading() > 1
        if (
            self.contiguous
            and order is None
            and self._fill_at_once(k, idx, keys, starts, rows, shared)
        ):
            return
        run_keys = (keys[starts] if order is None else keys[order[starts]]).tolist()
        bounds = starts.tolist()
        bounds.append(n)
        runs: Sequence[int] = range(len(run_keys))
        if order is None and len(run_keys) > 1:
            # runs in request order, each into its own slice of ``buf``: read session by
            # session (one lease per session, not per run); sorted() is stable
            runs = sorted(runs, key=lambda r: run_keys[r] >> ROW_BITS)

        def index_at(slot: int) -> int:  # the dataset index read into ``buf[slot]``
            return int(idx[slot] if order is None else idx[order[slot]])

        mapped_checked: set[int] = set()
        get, canonical = self.file_pool.lease, self.canonical
        last = -1
        handle: Handle | None = None
        raw: tuple[int, int] | None = None
        row_bytes = self.row_bytes[k]
        # contiguous runs of the session being read: (first row, first slot, end slot)
        pending: list[tuple[int, int, int]] = []

        def read_pending() -> None:
            """Read ``pending`` from ``raw``: one table; a read that fails names its rows."""
            assert raw is not None
            fd, base = raw
            table = [
                (fd, base + a * row_bytes, k0 * row_bytes, (k1 - k0) * row_bytes)
                for a, k0, k1 in pending
            ]
            try:
                read_table(rows, table, shared=shared, what="the row data")
            except ShortRead as exc:
                a, k0, k1 = pending[exc.row]
                raise self.read_error(exc, last, range(a, a + k1 - k0), index_at(k0), k) from exc
            pending.clear()

        try:
            for r in runs:
                key = run_keys[r]
                pos, a = key >> ROW_BITS, key & ROW_MASK
                k0, k1 = bounds[r], bounds[r + 1]
                if pos != last:
                    if pending:
                        read_pending()
                    if handle is not None:
                        self._done(handle, last, index_at(k0))
                        handle = None
                    try:
                        handle = get(canonical[pos])
                    except Exception as exc:
                        self.note(exc, pos, a, index_at(k0))
                        raise
                    if handle.maps[k] is None:
                        raw = handle.raws[k]
                    else:
                        raw = None
                        if pos not in mapped_checked:  # never fault on a truncated map
                            self.verify(handle, pos, "rows", index_at(k0))
                            mapped_checked.add(pos)
                    last = pos
                assert handle is not None
                length = k1 - k0
                if raw is not None:  # contiguous rows: read with the session's other runs
                    pending.append((a, k0, k1))
                    continue
                try:
                    self.fill_run(handle, k, pos, a, length, buf[k0:k1], index_at(k0))
                except MemoryError:
                    raise
                except Exception as exc:
                    raise self.read_error(exc, pos, range(a, a + length), index_at(k0), k) from exc
            if pending:
                read_pending()
            if handle is not None:
                self._done(handle, last, index_at(0))
                handle = None
        finally:
            if handle is not None:
                self.file_pool.release(handle)
        if order is not None:
            out[order] = buf

    def _fill_at_once(
        self,
        k: int,
        idx: np.ndarray,
        keys: np.ndarray,
        starts: np.ndarray,
        rows: np.ndarray,
        shared: bool,
    ) -> bool:
        """Read every run of a batch (request order) as one table, every file leased at once.

        Every session's file is leased with one hold of the file pool's mutex. Returns
        ``False``, having read nothing, where a session's file is not open (``lease_open``) or
        is not read raw (mapped, or HDF5 reads it): ``_fill`` then reads the batch session by
        session. Nothing here releases the GIL but the reads' system calls: each release is
        a hand-over to another thread (numpy's sorts and 2-D fancy indexing release it).
        """
        run_keys = keys[starts]
        slots: dict[int, int] = {}  # session: its place in order of first appearance
        places = [slots.setdefault(p, len(slots)) for p in (run_keys >> ROW_BITS).tolist()]
        sessions = list(slots)
        canonical = self.canonical
        leased = self.file_pool.lease_open([canonical[pos] for pos in sessions])
        if leased is None:
            return False
        try:
            raws = [handle.raws[k] if handle.maps[k] is None else None for handle in leased]
            if None in raws:
                return False
            row_bytes = self.row_bytes[k]
            ring = shared and starts.size >= RING_MIN_READS  # the table may go to a ring
            table = _run_table(run_keys, starts, idx.size, row_bytes, raws, places, ring)
            try:
                read_table(rows, table, shared=shared, what="the row data")
            except ShortRead as exc:
                r = exc.row
                key, k0 = int(run_keys[r]), int(starts[r])
                a = key & ROW_MASK
                run = range(a, a + int(table[r][3]) // row_bytes)
                raise self.read_error(exc, key >> ROW_BITS, run, int(idx[k0]), k) from exc
            for s, handle in enumerate(leased):
                if handle.watch:  # HDF5 read chunks of it: the rows are real rows
                    self.verify(handle, sessions[s], "rows", int(idx[starts[places.index(s)]]))
            return True
        finally:
            self.file_pool.release_all(leased)

    def _done(self, handle: Handle, pos: int, index: int) -> None:
        """Release a handle read through; first check the file when HDF5 read chunks of it.

        The rows read are real rows, not zeros past a new end of the file.
        """
        try:
            if handle.watch:
                self.verify(handle, pos, "rows", index)
        finally:
            self.file_pool.release(handle)

    def read_runs(
        self,
        read_rows: Callable[[Hashable, int, int], Sequence[Any]],
        idx: np.ndarray,
        keys: np.ndarray,
        order: np.ndarray | None,
        starts: np.ndarray | None,
    ) -> list[Any]:
        """Coalesced reads through a subclass's ``read_rows``; caller holds the handle lock.

        Args:
            read_rows: The subclass's hook.
            idx: Dataset indices of the batch (for messages).
            keys: Their packed keys.
            order: Read order from ``plan_runs``.
            starts: Run starts from ``plan_runs`` (``None``: one run per sample).

        Returns:
            One sample per key, in request order.

        Raises:
            ConfigError: ``read_rows`` returned the wrong number of samples.
        """
        n = idx.size
        if starts is None:
            starts = np.arange(n)
        run_keys = (keys[starts] if order is None else keys[order[starts]]).tolist()
        bounds = starts.tolist()
        bounds.append(n)
        result: list[Any] = [None] * n
        targets = list(range(n)) if order is None else order.tolist()
        ids = self.ids
        for r, key in enumerate(run_keys):
            pos, a = key >> ROW_BITS, key & ROW_MASK
            k, k2 = bounds[r], bounds[r + 1]
            try:
                samples = read_rows(ids[pos], a, a + (k2 - k))
                if len(samples) != k2 - k:
                    raise ConfigError(
                        f"read_rows({ids[pos]!r}, {a}, {a + k2 - k}) returned {len(samples)} "
                        f"samples, expected {k2 - k}."
                    )
            except Exception as exc:
                self.file_pool.discard(self.canonical[pos])
                self.note(exc, pos, a, int(idx[targets[k]]))
                raise
            for t, sample in zip(targets[k:k2], samples, strict=True):
                result[t] = sample
        return result


def _run_table(
    run_keys: np.ndarray,
    starts: np.ndarray,
    n: int,
    row_bytes: int,
    raws: list[tuple[int, int] | None],
    places: list[int],
    vectorised: bool,
) -> Table:
    """The table of a batch's runs: run ``r`` from its session's file into rows ``starts[r]..``.

    Built in numpy where the table goes to a ring (``vectorised``: a few microseconds whatever
    the number of runs), else as a list of tuples (no fixed numpy cost; a list is what the
    reads walk anyway).
    """
    if vectorised:
        fds, bases = np.array(raws, dtype=np.int64).T  # one row per session
        which = np.array(places)
        lengths = np.empty(starts.size, np.int64)  # rows per run (np.diff costs more)
        np.subtract(starts[1:], starts[:-1], out=lengths[:-1])
        lengths[-1] = n - starts[-1]
        table = np.empty((starts.size, 4), np.int64)
        table[:, 0] = fds[which]
        table[:, 1] = bases[which] + (run_keys & ROW_MASK) * row_bytes
        table[:, 2] = starts * row_bytes
        table[:, 3] = lengths * row_bytes
        return table
    bounds = starts.tolist()
    bounds.append(n)
    rows: list[tuple[int, int, int, int]] = []
    for r, key in enumerate(run_keys.tolist()):
        raw = raws[places[r]]
        assert raw is not None
        k0 = bounds[r]
        rows.append(
            (
                raw[0],
                raw[1] + (key & ROW_MASK) * row_bytes,
                k0 * row_bytes,
                (bounds[r + 1] - k0) * row_bytes,
            )
        )
    return rows
