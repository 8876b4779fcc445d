"""Rows of CSR matrices (AnnData ``.h5ad``): a batch's spans of ``data``/``indices`` read as runs.

``CSRReader`` is the ``SessionReader`` of a key that names a CSR group
(``loaderkit.hdf5.meta.anndata.CSRGroup``). Its two keys are the group's ``data`` and
``indices`` (1-D, read like any dataset of the base: ``os.preadv`` at the raw offset when
contiguous, the chunk index and codecs of ``chunkio`` when chunked -- decoded in the reading
thread, outside every lock -- and h5py otherwise); ``indptr`` is read once per session and
process and held (8 bytes a cell). A batch is read in sorted order: each row is the span
``[indptr[r], indptr[r+1])``, adjacent spans are one run (block order makes long runs), and
every run goes into one values buffer and one column-id buffer for the whole batch, then in
request order. Column ids are checked per batch (one vectorised pass): a damaged file is an
``HDF5FileError`` naming the row, never a wrong row.

What a batch becomes (``form``): ``"csr"`` (default) one ``torch.sparse_csr_tensor`` of shape
``(batch, n_vars)`` built from the buffers, a sample a 1-D ``torch.sparse_coo_tensor``;
``"dense"`` rows scattered into a zeroed batch buffer (``batch_buffer``: a worker's slot);
``"tokens"`` per row ``{"genes": int64 ids, "values": values}``, a batch padded as
``pad_collate`` pads it. A gene subset (``select_genes``) keeps some columns, renumbered.

Example:
    >>> from loaderkit.hdf5.meta.anndata import CSRGroup
    >>> CSRReader.read_batch.__name__, FORMS
    ('read_batch', ('csr', 'dense', 'tokens'))
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import torch

from loaderkit.errors import ConfigError, HDF5FileError
from loaderkit.hdf5.meta.anndata import (
    CSRGroup,
    check_csr,
    sparse_group,
    var_difference,
    var_names,
    var_path,
)
from loaderkit.hdf5.meta.index import ROW_BITS, ROW_MASK
from loaderkit.hdf5.meta.inventory import inspect_session
from loaderkit.hdf5.meta.keyspecs import KeySpec, SessionRecord
from loaderkit.hdf5.read.handles import Handle
from loaderkit.hdf5.read.rawio import pread
from loaderkit.hdf5.read.reader import SessionReader
from loaderkit.workers.collate import Padded, RowBatch, batch_buffer

__all__ = ["FORMS", "CSRReader", "csr_sessions"]

#: What a batch of CSR rows becomes: a sparse CSR tensor, dense rows, or (gene ids, values).
FORMS = ("csr", "dense", "tokens")


class CSRReader(SessionReader):
    """Reads rows of a CSR group: keys 0 and 1 are its ``data`` and ``indices``.

    Built with the arguments of ``SessionReader`` (``specs``: the group's ``data`` then
    ``indices``; ``records``: what each file held of them) and:

    Args:
        groups: Per session, its ``CSRGroup`` (rows, columns, path).
        var: The column names every session shares (``None``: the files have no ``var``).
        **kwargs: ``SessionReader``'s arguments.

    Example:
        >>> CSRReader.session_rows.__name__
        'session_rows'
    """

    def __init__(
        self, *, groups: Sequence[CSRGroup], var: Sequence[str] | None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.groups = list(groups)
        self.n_vars = self.groups[0].n_vars if self.groups else 0
        self.var = None if var is None else list(var)
        self.form = "csr"
        #: Per column, its new number (-1: left out); ``None``: every column, as stored.
        self.remap: np.ndarray | None = None
        self.n_out = self.n_vars
        self._indptrs: dict[int, np.ndarray] = {}
        self._indptr_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_indptrs"] = None  # read again where needed: never pickled (8 bytes a cell)
        state["_indptr_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._indptrs = {}
        self._indptr_lock = threading.Lock()

    # ------------------------------------------------------------------ configuration

    def session_rows(self) -> list[int]:
        """Rows (cells) per session: the groups' ``shape[0]``."""
        return [group.n_obs for group in self.groups]

    def chunk_rows(self) -> list[int]:
        """1 for every session: a row is a span of ``data``, not rows of a chunked array.

        A chunk of ``data`` holds a number of values, not of rows (anndata: 15,625 values, a
        few dozen cells); blocks of rows are cut by the block sampler's size alone.
        """
        return [1] * len(self.groups)

    def configure(self, form: str, genes: Any = None) -> None:
        """Serve rows as ``form`` (one of ``FORMS``), only the columns ``genes`` selects.

        Args:
            form: ``"csr"``, ``"dense"`` or ``"tokens"``.
            genes: ``None`` (every column), a boolean mask over the columns, or var names
                (columns renumbered in the order given).

        Raises:
            ConfigError: An unknown form, a mask of the wrong length, names not in ``var``.
        """
        if form not in FORMS:
            raise ConfigError(f"sparse={form!r}: expected one of {list(FORMS)}.")
        self.form = form
        if genes is None:
            self.remap, self.n_out = None, self.n_vars
            return
        chosen = np.asarray(genes)
        if chosen.dtype == bool:
            if chosen.shape != (self.n_vars,):
                raise ConfigError(
                    f"genes= is a boolean mask of shape {chosen.shape}; the matrix has "
                    f"{self.n_vars} columns: pass a mask of shape ({self.n_vars},)."
                )
            keep = np.flatnonzero(chosen)
        else:
            if self.var is None:
                raise ConfigError(
                    "genes= names genes but the files have no var index; pass a boolean mask."
                )
            where = {name: i for i, name in enumerate(self.var)}
            missing = [str(g) for g in chosen.tolist() if str(g) not in where]
            if missing:
                raise ConfigError(
                    f"genes= names {len(missing)} genes not in the files' var index, first "
                    f"{missing[:5]}; pass names from var (or a boolean mask)."
                )
            keep = np.array([where[str(g)] for g in chosen.tolist()], np.int64)
        remap = np.full(self.n_vars, -1, np.int64)
        remap[keep] = np.arange(keep.size)
        self.remap, self.n_out = remap, int(keep.size)

    # ------------------------------------------------------------------ indptr

    def indptr(self, handle: Handle, pos: int) -> np.ndarray:
        """Session ``pos``'s ``indptr`` (int64), read once per process and held; checked."""
        key = self.canonical[pos]
        held = self._indptrs.get(key)
        if held is not None:
            return held
        group = self.groups[pos]
        with self._indptr_lock:
            held = self._indptrs.get(key)
            if held is None:
                indptr = np.asarray(handle.file[group.indptr][()], dtype=np.int64)
                nnz = [int(d.shape[0]) for d in handle.datasets[:2]]
                check_csr(group, indptr, nnz[0], nnz[1], self.ids[pos], self.paths[pos])
                self._indptrs[key] = held = indptr
        return held

    # ------------------------------------------------------------------ reads

    def read_one(self, index: int, pos: int, row: int) -> Any:
        """Sample ``index`` (session ``pos``, ``row``) in this reader's form."""
        lengths, values, cols = self.gather(
            np.array([index], np.int64), np.array([(pos << ROW_BITS) | row], np.int64)
        )
        return self._samples(lengths, values, cols)[0]

    def read_batch(self, idx: np.ndarray, keys: np.ndarray) -> RowBatch:
        """The rows of ``keys`` (dataset indices ``idx``) as one batch in this reader's form.

        Returns:
            A ``RowBatch`` whose ``tensor`` is the batch (``collate`` returns it) and whose
            samples are built only when something asks for them.
        """
        lengths, values, cols = self.gather(idx, keys)
        n = lengths.size
        if self.form == "dense":
            tensor, out = batch_buffer(n, (self.n_out,), values.dtype)
            out.fill(0)
            out[np.repeat(np.arange(n), lengths), cols] = values
            return RowBatch(tensor, list(out))
        if self.form == "tokens":
            return RowBatch(_padded(lengths, values, cols), lambda: _tokens(lengths, values, cols))
        crow = np.zeros(n + 1, cols.dtype)
        np.cumsum(lengths, out=crow[1:])
        tensor = torch.sparse_csr_tensor(
            torch.from_numpy(crow),
            torch.from_numpy(cols),
            torch.from_numpy(values),
            size=(n, self.n_out),
            check_invariants=False,
        )
        return RowBatch(tensor, lambda: self._samples(lengths, values, cols))

    def _samples(self, lengths: np.ndarray, values: np.ndarray, cols: np.ndarray) -> list[Any]:
        """Per-row samples in this reader's form."""
        if self.form == "tokens":
            return _tokens(lengths, values, cols)
        bounds = np.concatenate(([0], np.cumsum(lengths))).tolist()
        samples: list[Any] = []
        for a, b in itertools.pairwise(bounds):
            if self.form == "dense":
                row = np.zeros(self.n_out, values.dtype)
                row[cols[a:b]] = values[a:b]
                samples.append(row)
            else:
                ids = torch.from_numpy(cols[a:b].astype(np.int64)).reshape(1, -1)
                samples.append(
                    torch.sparse_coo_tensor(
                        ids, torch.from_numpy(values[a:b]), (self.n_out,), check_invariants=False
                    )
                )
        return samples

    def gather(
        self, idx: np.ndarray, keys: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Read rows ``keys``: ``(lengths, values, column ids)`` in request order.

        Column ids are renumbered by the gene subset (``configure``) and are ``int32`` or
        ``int64`` (as the file stores them, int64 for other integer types).
        """
        n = idx.size
        order = np.argsort(keys, kind="stable")
        skeys = keys[order]
        spos, srows = skeys >> ROW_BITS, skeys & ROW_MASK
        cuts = (np.flatnonzero(spos[1:] != spos[:-1]) + 1).tolist()
        segments = list(zip([0, *cuts], [*cuts, n], strict=True))
        begin = np.empty(n, np.int64)  # each row's span in its file's data, sorted order
        end = np.empty(n, np.int64)
        for s0, s1 in segments:
            p = int(spos[s0])
            ptr = self._held_indptr(p, int(srows[s0]), int(idx[order[s0]]))
            rows = srows[s0:s1]
            begin[s0:s1] = ptr[rows]
            end[s0:s1] = ptr[rows + 1]
        lengths = end - begin
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        data_rt, index_rt = self.types[0], self.types[1]
        values = np.empty(total, data_rt.read_dtype)
        cols = np.empty(total, index_rt.read_dtype)
        for s0, s1 in segments:
            self._read_session(idx, order, spos, srows, begin, end, offsets, s0, s1, values, cols)
        if data_rt.swap:
            values = values.astype(data_rt.mem_dtype)
        if cols.dtype not in (np.dtype(np.int32), np.dtype(np.int64)) or total >= 2**31:
            cols = cols.astype(np.int64)
        if not np.array_equal(order, np.arange(n)):  # request order: one gather
            inverse = np.empty(n, np.int64)
            inverse[order] = np.arange(n)
            lengths = lengths[inverse]
            starts = offsets[:-1][inverse]
            shift = np.zeros(n + 1, np.int64)
            np.cumsum(lengths, out=shift[1:])
            take = np.repeat(starts - shift[:-1], lengths) + np.arange(total)
            values, cols = values[take], cols[take]
        if self.remap is not None:
            renumbered = self.remap[cols]
            keep = renumbered >= 0
            kept = np.zeros(total + 1, np.int64)
            np.cumsum(keep, out=kept[1:])
            crow = np.zeros(n + 1, np.int64)
            np.cumsum(lengths, out=crow[1:])
            lengths = kept[crow[1:]] - kept[crow[:-1]]
            values, cols = values[keep], renumbered[keep].astype(cols.dtype)
        return lengths, values, cols

    def _held_indptr(self, pos: int, row: int, index: int) -> np.ndarray:
        held = self._indptrs.get(self.canonical[pos])
        if held is not None:
            return held
        handle = self.leased(pos, row, index)
        try:
            return self.indptr(handle, pos)
        except Exception as exc:
            self.note(exc, pos, row, index)
            raise
        finally:
            self.cache.release(handle)

    def _read_session(
        self,
        idx: np.ndarray,
        order: np.ndarray,
        spos: np.ndarray,
        srows: np.ndarray,
        begin: np.ndarray,
        end: np.ndarray,
        offsets: np.ndarray,
        s0: int,
        s1: int,
        values: np.ndarray,
        cols: np.ndarray,
    ) -> None:
        """Read sorted rows ``s0:s1`` (one session) as runs of adjacent spans; check columns."""
        pos = int(spos[s0])
        breaks = np.flatnonzero(begin[s0 + 1 : s1] != end[s0 : s1 - 1]) + s0 + 1
        firsts = [s0, *breaks.tolist()]
        lasts = [*breaks.tolist(), s1]
        index = int(idx[order[s0]])
        handle = self.leased(pos, int(srows[s0]), index)
        try:
            if any(m is not None for m in handle.maps):  # never fault on a truncated map
                self.verify(handle, pos, "rows", index)
            first, last = np.array(firsts, np.int64), np.array(lasts, np.int64)
            runs = (begin[first], end[last - 1] - begin[first], offsets[first])
            done = [
                self._pread_pieces(handle, k, *runs, out) for k, out in ((0, values), (1, cols))
            ]
            for r0, r1 in zip(firsts, lasts, strict=True):
                a, length = int(begin[r0]), int(end[r1 - 1] - begin[r0])
                if not length:
                    continue
                o0 = int(offsets[r0])
                for k, out in ((0, values), (1, cols)):
                    if done[k]:
                        continue
                    try:
                        self._span(handle, k, pos, a, length, out[o0 : o0 + length], index)
                    except MemoryError:
                        raise
                    except Exception as exc:
                        rows = range(int(srows[r0]), int(srows[r1 - 1]) + 1)
                        raise self.read_error(exc, pos, rows, int(idx[order[r0]]), k) from exc
        except BaseException:
            self.cache.release(handle)
            raise
        self._done(handle, pos, index)
        self._check_columns(cols, offsets, s0, s1, srows, pos, idx, order)

    def _pread_pieces(
        self,
        handle: Handle,
        k: int,
        starts: np.ndarray,
        lengths: np.ndarray,
        at: np.ndarray,
        out: np.ndarray,
    ) -> bool:
        """Every run of key ``k`` read with one ``os.preadv`` per piece, the pieces planned at once.

        A run ``[starts[i], starts[i] + lengths[i])`` of elements goes to ``out[at[i]:]``; a
        piece is its part in one chunk (uncompressed chunks, anndata's default: their file
        offsets from the chunk index) or the whole run (contiguous data). Returns ``False``,
        leaving the reads to ``_span`` (which names what fails), where the key is compressed or
        read through h5py, a chunk was never written, or a read came back short.
        """
        chunked, raw = handle.chunked[k], handle.raws[k]
        keep = lengths > 0
        starts, lengths, at = starts[keep], lengths[keep], at[keep]
        item = out.dtype.itemsize
        if raw is not None:
            fd, where, into, nbytes = raw[0], raw[1] + starts * item, at * item, lengths * item
        elif (
            chunked is not None
            and not chunked.filters
            and chunked.offsets is not None
            and len(chunked.shape) == 1
            and out.dtype == chunked.dtype
        ):
            size = chunked.chunks[0]
            first = starts // size
            count = (starts + lengths - 1) // size - first + 1
            run = np.repeat(np.arange(starts.size), count)
            ahead = np.cumsum(count) - count  # pieces before each run
            chunk = first[run] + np.arange(run.size) - ahead[run]
            lo = np.maximum(starts[run], chunk * size)
            hi = np.minimum((starts + lengths)[run], (chunk + 1) * size)
            located = chunked.offsets[chunk]
            if located.size and int(located.min()) < 0:  # never written: the fill value
                return False
            fd, where = chunked.fd, located + (lo - chunk * size) * item
            into, nbytes = (at[run] + lo - starts[run]) * item, (hi - lo) * item
        else:
            return False
        with out.view(np.uint8).data as flat:
            for offset, o, n in zip(where.tolist(), into.tolist(), nbytes.tolist(), strict=True):
                try:
                    if os.preadv(fd, [flat[o : o + n]], offset) < n:
                        return False
                except OSError:
                    return False
        return True

    def _span(
        self, handle: Handle, k: int, pos: int, a: int, length: int, out: np.ndarray, index: int
    ) -> None:
        """Elements ``a..a+length-1`` of key ``k`` into ``out``.

        Uncompressed chunks (anndata's default) are read with one ``pread`` per chunk the span
        touches, straight from the chunk index; everything else through ``fill_run``.
        """
        chunked = handle.chunked[k]
        if (
            chunked is None
            or chunked.filters
            or chunked.offsets is None  # the index is built by the first fill_run
            or len(chunked.shape) != 1
            or out.dtype != chunked.dtype
        ):
            self.fill_run(handle, k, pos, a, length, out, index)
            return
        size, item = chunked.chunks[0], chunked.dtype.itemsize
        offsets = chunked.offsets
        done = 0
        while done < length:
            at = a + done
            band = at // size
            take = min(length - done, (band + 1) * size - at)
            where = int(offsets[band])
            if where < 0:  # never written: the fill value
                out[done : done + take] = chunked.fill
            else:
                part = out[done : done + take]
                pread((chunked.fd, where), (at - band * size) * item, part, take * item)
            done += take

    def _check_columns(
        self,
        cols: np.ndarray,
        offsets: np.ndarray,
        s0: int,
        s1: int,
        srows: np.ndarray,
        pos: int,
        idx: np.ndarray,
        order: np.ndarray,
    ) -> None:
        """``HDF5FileError`` naming the first row of ``s0:s1`` with a column id out of range."""
        part = cols[int(offsets[s0]) : int(offsets[s1])]
        if not part.size or (int(part.min()) >= 0 and int(part.max()) < self.n_vars):
            return
        bad = int(np.flatnonzero((part < 0) | (part >= self.n_vars))[0]) + int(offsets[s0])
        at = int(np.searchsorted(offsets, bad, side="right")) - 1
        self.cache.discard(self.canonical[pos])
        error = HDF5FileError(
            f"session {self.ids[pos]!r} ({self.paths[pos]}), key {self.groups[pos].path!r}: row "
            f"{int(srows[at])} holds column id {int(cols[bad])}, outside 0..{self.n_vars - 1} "
            f"(shape {(self.groups[pos].n_obs, self.n_vars)}); the CSR group's 'indices' are "
            "damaged, so the row was not returned. Write the file again (anndata's "
            "write_h5ad) or leave the session out."
        )
        self.note(error, pos, int(srows[at]), int(idx[order[at]]))
        raise error


def _tokens(lengths: np.ndarray, values: np.ndarray, cols: np.ndarray) -> list[dict[str, Any]]:
    """Per row ``{"genes": int64 ids, "values": values}``."""
    bounds = np.concatenate(([0], np.cumsum(lengths))).tolist()
    return [
        {
            "genes": torch.from_numpy(cols[a:b].astype(np.int64)),
            "values": torch.from_numpy(values[a:b].copy()),
        }
        for a, b in itertools.pairwise(bounds)
    ]


def _padded(lengths: np.ndarray, values: np.ndarray, cols: np.ndarray) -> dict[str, Padded]:
    """The token rows padded at the end with 0, as ``pad_collate`` pads them."""
    n = lengths.size
    width = int(lengths.max()) if n else 0
    genes = np.zeros((n, width), np.int64)
    vals = np.zeros((n, width), values.dtype)
    rows = np.repeat(np.arange(n), lengths)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    within = np.arange(int(lengths.sum())) - np.repeat(starts, lengths)
    genes[rows, within] = cols
    vals[rows, within] = values
    counts = torch.from_numpy(lengths.astype(np.int64))
    return {
        "genes": Padded(torch.from_numpy(genes), counts),
        "values": Padded(torch.from_numpy(vals), counts.clone()),
    }


def csr_sessions(
    open_file: Callable[[int], Any],
    ids: Sequence[Hashable],
    paths: Sequence[str],
    specs: Sequence[KeySpec],
    *,
    identity: bool = True,
) -> tuple[list[SessionRecord], list[KeySpec], list[CSRGroup], list[str] | None] | None:
    """What every session holds of a key naming a CSR group; ``None`` for any other key.

    Opens each file once (``open_file(pos)``): the group's encoding and shape, its ``indptr``
    checked against ``data``/``indices`` (``check_csr``), and the ``var`` index, which every
    session must share (names and order). ``identity=False``: records without the local
    file's identity (``inventory.inspect_session``; files read through a cache).

    Returns:
        ``(records, specs, groups, var)``: per session the ``SessionRecord`` of the group's
        ``data`` and ``indices`` (the two keys ``specs``), its ``CSRGroup``, and the shared
        var names (``None`` when the files have no ``var`` index).

    Raises:
        ConfigError: CSC or unknown encodings (``sparse_group``), a CSR key with other keys
            or a ``sample_axis``, sessions whose key is not CSR or whose var index differs.
        HDF5FileError: A damaged CSR group (named file, row and what is wrong).
    """
    if not specs:
        return None
    with open_file(0) as f:
        found = [sparse_group(f.get(s.path), s.path, ids[0], paths[0]) for s in specs]
    if all(group is None for group in found):
        return None
    key = next(s.path for s, group in zip(specs, found, strict=True) if group is not None)
    if len(specs) > 1 or specs[0].axis != 0:
        raise ConfigError(
            f"key {key!r} is a CSR matrix: it is read on its own, rows along axis 0, for now "
            "(pass key=" + repr(key) + " without other keys or sample_axis)."
        )
    spec = specs[0]
    records: list[SessionRecord] = []
    groups: list[CSRGroup] = []
    var: list[str] | None = None
    parts: list[KeySpec] = []
    for pos, (sid, path) in enumerate(zip(ids, paths, strict=True)):
        with open_file(pos) as f:
            group = sparse_group(f.get(key), key, sid, path)
            if group is None:
                raise ConfigError(
                    f"key {key!r} of session {sid!r} ({path}) is not a CSR matrix, but it is "
                    f"in session {ids[0]!r} ({paths[0]}): pass files of one encoding."
                )
            data, indices = f[group.data], f[group.indices]
            if indices.dtype.kind not in "iu" or data.ndim != 1 or indices.ndim != 1:
                raise HDF5FileError(
                    f"key {key!r} of session {sid!r} ({path}): 'data' {data.shape} and "
                    f"'indices' {indices.shape} ({indices.dtype}) are not 1-D values and "
                    "integer column ids; the CSR group is damaged. Write the file again."
                )
            indptr = np.asarray(f[group.indptr][()], np.int64)
            check_csr(group, indptr, data.shape[0], indices.shape[0], sid, path)
            del indptr
            names = var_names(f, var_path(key))
            if pos == 0:
                var = names
            how = _var_differs(var, names, group, groups[0] if groups else group)
            if how is not None:
                raise ConfigError(
                    f"session {sid!r} ({path}): its var index ({var_path(key)!r}) differs from "
                    f"session {ids[0]!r}'s ({paths[0]}): {how}. Every file's columns must be "
                    "the same genes in the same order: subset or reorder them when writing "
                    "(adata[:, genes].write_h5ad), or pass files of one var index."
                )
            parts = [KeySpec(spec.name, group.data), KeySpec(f"{spec.name}/indices", group.indices)]
            record, _, _ = inspect_session(f, parts, sid, path, identity=identity)
        records.append(record)
        groups.append(group)
    return records, parts, groups, var


def _var_differs(
    first: list[str] | None, names: list[str] | None, group: CSRGroup, first_group: CSRGroup
) -> str | None:
    """How a session's columns differ from the first session's, or ``None``."""
    if first is not None and names is not None:
        return var_difference(first, names)
    if group.n_vars != first_group.n_vars:
        return f"it has {group.n_vars} columns where the first file has {first_group.n_vars}"
    if (first is None) != (names is None):
        return "one of the two files has no var index"
    return None
