"""Building an ``HDF5SessionDataset``: what every file holds, read once, and the reader over it.

``DatasetInspection`` is the step ``HDF5SessionDataset.__init__`` takes first (it is not kept
afterwards: what it found lives on in the reader's records): it opens each session file once in
the constructing process (``loaderkit.hdf5.meta.inventory``: keys, layouts, types, filters,
identities), finds the key when none is given, tells files listed twice apart, builds the
``SessionReader``, and packs the index ``build_index`` returned.
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import h5py
import numpy as np

from loaderkit.errors import ConfigError, HDF5FileError, warn
from loaderkit.hdf5.anndata import (
    FORMS,
    AnnDataReader,
    CellChoice,
    CSRGroup,
    CSRMatrix,
    CSRSessions,
    DenseColumns,
    LabelColumns,
    LabelKey,
    VarTableBuilder,
    check_matrix,
    choose_cells,
    csr_sessions,
    gene_map,
    is_dense_matrix,
    matrix_arguments_refused,
    var_names,
    var_path,
)
from loaderkit.hdf5.convert.rowcache import cached_record
from loaderkit.hdf5.meta.diagnose import metadata_errors, open_diagnosis
from loaderkit.hdf5.meta.index import (
    pack_index,
)
from loaderkit.hdf5.meta.inventory import (
    check_aligned,
    check_rows,
    inspect_session,
    parse_keys,
    row_types,
)
from loaderkit.hdf5.meta.keyspecs import KeySpec, SessionRecord
from loaderkit.hdf5.meta.layout import (
    advise,
    dataset_names,
    open_kwargs,
)
from loaderkit.hdf5.meta.types import RowType
from loaderkit.hdf5.read.reader import Reader, SessionReader
from loaderkit.hdf5.read.sessionfiles import where_sessions
from loaderkit.hdf5.remote.remotemeta import (
    MetaStore,
    RemoteRecord,
    inspect_remote,
    open_remote,
    tree_names,
)
from loaderkit.hdf5.remote.sources import SessionSources
from loaderkit.plan import counted
from loaderkit.storage import ObjectInfo

__all__ = ["DatasetInspection"]

#: What one file holds of a CSR key: record, the keys ``data`` and ``indices``, group, var.
_CSRSession = tuple[SessionRecord, list[KeySpec], CSRGroup, list[str] | None]


class DatasetInspection:
    """What a dataset's files hold, read once where it is constructed; the reader over it.

    Args:
        ids: Session ids, in position order.
        paths: Their paths (or URLs).
        key: The dataset's ``key=`` (``None``: found here when the first file holds one
            dataset; ``key`` then holds what was found).
        fields: The compound fields read (``None``: all).
        sample_axis: The axis that indexes samples.
        h5py_options: Keyword arguments for ``h5py.File``.
        sources: The sessions read through a cache (``None``: every file read in place).
        item_fast: The dataset reads with the default ``read``.
        custom_index: The dataset's class overrides ``build_index``.
        label: The dataset's class name, for messages.
        columns: ``join=`` or ``genes=`` was given: a dense anndata matrix's files are aligned
            by their var indexes (``anndata.densejoin``), so their widths may differ.

    Example:
        >>> DatasetInspection.reader.__name__
        'reader'
    """

    def __init__(
        self,
        ids: Sequence[Hashable],
        paths: Sequence[str],
        key: Any,
        *,
        fields: tuple[str, ...] | None,
        sample_axis: int,
        h5py_options: dict[str, Any],
        sources: SessionSources | None,
        item_fast: bool,
        custom_index: bool,
        label: str,
        columns: bool = False,
    ) -> None:
        self._ids = list(ids)
        self._paths = list(paths)
        self.key = key
        self.fields = fields
        self.sample_axis = sample_axis
        self.h5py_options = h5py_options
        self._sources = sources
        self._item_fast = item_fast
        self._custom_index = custom_index
        self.label = label
        self.columns = columns

    def _remote_info(self, pos: int) -> ObjectInfo | None:
        """The object session ``pos`` is, when it is a URL (its metadata is read remotely)."""
        sources = self._sources
        return None if sources is None else sources.remote.get(pos)

    def _open_for_inspection(self, pos: int) -> Any:
        sid, path = self._ids[pos], self._paths[pos]
        info = self._remote_info(pos)
        if info is not None:
            assert self._sources is not None
            return open_remote(info, sid, self._sources.storage_options)
        try:
            return h5py.File(path, "r", **self.h5py_options)
        except FileNotFoundError as exc:
            raise FileNotFoundError(
                f"session {sid!r}: file {path} does not exist ({exc})."
            ) from exc
        except TypeError as exc:
            raise ConfigError(
                f"h5py_options {self.h5py_options!r} rejected by h5py.File: {exc}"
            ) from exc
        except Exception as exc:
            locking = self.h5py_options.get("locking", True) is not False
            hint, os_error, advice = open_diagnosis(path, locking=locking)
            raise HDF5FileError(
                *((os_error.errno,) if os_error is not None and os_error.errno else ()),
                f"session {sid!r}: cannot open {path} as HDF5: {hint or 'HDF5 refused it'} "
                f"(HDF5: {exc}).{' ' + advice if advice else ''}",
            ) from (os_error or exc)

    @staticmethod
    def check_form(sparse: str) -> None:
        """Refuse a ``sparse=`` that is none of the forms a matrix's rows are served in.

        Raises:
            ConfigError: ``sparse`` is not one of ``FORMS``.
        """
        if sparse not in FORMS:
            raise ConfigError(f"sparse={sparse!r}: expected one of {list(FORMS)}.")

    @staticmethod
    def configure(
        reader: Reader, anndata: AnnDataReader | None, sparse: str, genes: Any, join: str | None
    ) -> None:
        """Serve the AnnData part's matrix as ``sparse=``, ``genes=`` and ``join=`` say.

        Raises:
            ConfigError: Any of them given where no AnnData matrix maps columns, or refused by
                the AnnData part (``AnnDataReader.configure``).
        """
        if anndata is not None:
            anndata.configure(sparse, genes, join)
        elif sparse != "csr" or genes is not None or join is not None:
            raise matrix_arguments_refused(sparse, reader.files.key_names)

    def reader(
        self, max_open: int, memory_map: bool | None, max_session_bytes: int
    ) -> tuple[Reader, AnnDataReader | None]:
        """Read what every file holds (main process only) and build the reader over it.

        Returns:
            The reader, and the same reader as the AnnData part where the keys are AnnData's
            (a matrix whose columns are genes, per-cell anndata columns), else ``None``.

        Args:
            max_open: Most files open at once per process.
            memory_map: Read contiguous rows through memory maps (``None``: not whole rows;
                a CSR reader copies warm pieces out of whole-file maps unless ``False``).
            max_session_bytes: Most bytes of whole sessions held per process.
        """
        specs = parse_keys(self.key, self.sample_axis)
        if specs is None:
            found = self._autodetect_key()
            specs = [] if found is None else parse_keys(found, self.sample_axis) or []
            self.key = found
        kept = self._remote_records(specs)
        csr = self._csr_reader(specs, kept, max_open, memory_map, max_session_bytes)
        if csr is not None:  # AnnData's CSR matrix: its own part (anndata.csrmatrix)
            return csr, csr
        records: list[SessionRecord] = []
        resolved: list[KeySpec] = list(specs)
        uneven = [False] * len(specs)
        remote, known = self._dense_remote(kept)
        columns = None if remote else LabelColumns(specs, every=False)  # anndata's obs columns
        matrix = bool(specs) and is_dense_matrix(specs[0].path)  # X, layers/<name>, raw/X
        # its files' genes: aligned under join=/genes=, else checked alike (local files)
        aligned = matrix and (self.columns or self._sources is None)
        var_table = self._var_table(specs) if aligned else None
        for pos, (sid, path) in enumerate(zip(self._ids, self._paths, strict=True)):
            if pos in remote:
                record, resolved, odd = remote[pos]
            else:
                with self._open_for_inspection(pos) as f:
                    here = specs if columns is None else self._columns(columns, f, pos)
                    record, resolved, odd = inspect_session(f, here, sid, path)
                    if var_table is not None:  # the genes of its columns
                        width = record.layouts[0].row_shape
                        var = var_names(f, var_path(specs[0].path))
                        var_table.add(var, width[0] if len(width) == 1 else 0)
                    if self._sources is not None and self._sources.cached(pos):
                        layout = self._sources.cache.layout  # read from the cache's copy
                        record = cached_record(record, f, resolved, layout)
            records.append(record)
            uneven = [a or b for a, b in zip(uneven, odd, strict=True)]
        served = [] if columns is None else columns.labels(records, self._ids, self._paths)
        files = list(zip(self._ids, self._paths, strict=True))
        check_aligned(records, resolved, files)
        types: list[RowType] = []
        type_error: ConfigError | None = None
        if var_table is not None and not self.columns:  # one var index, or refused by name
            where = where_sessions(self._ids, self._paths)
            gene_map(var_table.table(), None, None, key=specs[0].path, where=where)
            var_table = None
        try:
            if matrix:  # widths differ only under join=/genes=
                check_matrix(records, resolved, files, columns=var_table is not None)
            else:
                check_rows(records, resolved, files)
            types = row_types(
                records, resolved, self.fields, files, self._open_for_inspection, known
            )
        except ConfigError as exc:
            if self._item_fast:
                raise
            # ``read`` is overridden and may convert such rows itself: the base ``read``
            # raises this when (and only when) an override calls it through ``super()``
            type_error = exc
        for k, spec in enumerate(resolved):  # group keys: one row shape in every session
            shapes = {rec.layouts[k].row_shape for rec in records if rec.layouts[k].rows}
            uneven[k] = uneven[k] or (spec.members and len(shapes) > 1)
            if not spec.members:
                advise([rec.layouts[k] for rec in records], self._ids, self._paths, spec.path)
        first = [rec.layouts[0] if rec.layouts else None for rec in records]
        rows = SessionReader(
            keys=_beside(len(resolved), DenseColumns.keys if var_table is not None else ()),
            ids=self._ids,
            paths=self._paths,
            canonical=self._canonical(records),
            specs=resolved,
            types=types,
            type_error=type_error,
            records=records,
            open_kwargs=[
                open_kwargs(lay, self.h5py_options, default_read=self._item_fast) for lay in first
            ],
            max_open=max_open,
            memory_map=bool(memory_map),
            fast=self._item_fast,
            single=isinstance(self.key, str),
            label=f"{self.label} over {counted(len(self._ids), 'session')}",
            uneven=[k for k, odd in enumerate(uneven) if odd],
            max_session_bytes=max_session_bytes,
        )
        if var_table is not None:  # a dense matrix aligned by its genes (anndata.densejoin)
            table = var_table.table()
            dense = DenseColumns(rows, table)
            reader = AnnDataReader(
                rows, matrix=dense, served=served, table=table, name=resolved[0].name
            )
            return reader, reader
        if any(label is not None for label in served):  # per-cell anndata columns
            reader = AnnDataReader(rows, matrix=None, served=served)
            return reader, reader
        return rows, None

    def _var_table(self, specs: Sequence[KeySpec]) -> VarTableBuilder:
        """An empty table of var indexes: a dense matrix under ``join=``/``genes=``.

        Raises:
            ConfigError: Files read through URLs or a node cache (local files only, for now).
        """
        if self._sources is not None:
            raise ConfigError(
                f"join= and genes= on the dense matrix {specs[0].path!r} read each file's var "
                "index where the dataset is built, from local files without cache= only, for "
                "now. Pass local paths without cache=, or files that share their genes."
            )
        return VarTableBuilder()

    def _columns(self, columns: LabelColumns, f: h5py.File, pos: int) -> list[KeySpec]:
        """Session ``pos``'s keys, anndata's per-cell columns as their rows' datasets.

        Raises:
            ConfigError: Such a column in a file read through the node cache (local files
                only, for now), or stored otherwise than in the first file (``LabelColumns``).
        """
        here = columns.resolve(f, self._ids[pos], self._paths[pos])
        found = [s.path for s, c in zip(columns.specs, columns.columns[-1], strict=True) if c]
        if found and self._sources is not None:
            raise ConfigError(
                f"keys {found} of session {self._ids[pos]!r} ({self._paths[pos]}) are anndata "
                "columns (categoricals, strings with missing values) of files read through "
                "URLs or a node cache: those are read from local files only, for now. Pass "
                "local files without cache=, or leave the keys out."
            )
        return here

    def _csr_reader(
        self,
        specs: Sequence[KeySpec],
        remote: Mapping[int, RemoteRecord],
        max_open: int,
        memory_map: bool | None,
        max_session_bytes: int,
    ) -> AnnDataReader | None:
        """The reader of a key naming a CSR group (``anndata.csrmatrix``); ``None`` for other keys.

        Files read in place are inspected by ``csr_sessions``; files read through the node
        cache one by one (``_cached_csr``: URLs from their kept ``RemoteRecord``).
        """
        known: dict[tuple[int, int], RowType | Exception] = {}
        if self._sources is None:
            found = csr_sessions(self._open_for_inspection, self._ids, self._paths, specs)
        else:
            found = self._cached_csr(specs, remote, known)
        if found is None:
            return None
        records, parts = found.records, found.specs
        files = list(zip(self._ids, self._paths, strict=True))
        check_rows(records, parts, files)
        types = row_types(records, parts, None, files, self._open_for_inspection, known)
        sizes = [rec.identity.size for rec in records if rec.identity is not None]
        rows = SessionReader(
            keys=_beside(len(parts), CSRMatrix.keys),  # the labels beside the matrix
            ids=self._ids,
            paths=self._paths,
            canonical=self._canonical(records),
            specs=parts,
            types=types,
            records=records,
            open_kwargs=[
                open_kwargs(rec.layouts[0], self.h5py_options, default_read=self._item_fast)
                for rec in records
            ],
            max_open=max_open,
            memory_map=bool(memory_map),
            fast=True,
            single=isinstance(self.key, str),  # a tuple or mapping key: dict samples
            label=f"{self.label} over {counted(len(self._ids), 'session')}",
            max_session_bytes=max_session_bytes,
        )
        # messages name the matrix and its labels, not its data and indices
        rows.files.key_names = [found.name, *(label.name for label in found.labels)]
        matrix = CSRMatrix(
            files=rows.files,
            groups=found.groups,
            table=found.vars,
            file_bytes=sum(sizes),
            file_maps=memory_map is not False,
        )
        served: list[LabelKey | None] = [None] * len(parts)  # the matrix's keys: as read
        for k, label in zip(rows.keys, found.labels, strict=True):
            served[k] = label
        return AnnDataReader(rows, matrix=matrix, served=served, table=found.vars, name=found.name)

    def _cached_csr(
        self,
        specs: Sequence[KeySpec],
        remote: Mapping[int, RemoteRecord],
        known: dict[tuple[int, int], RowType | Exception],
    ) -> CSRSessions | None:
        """``csr_sessions``'s result for a dataset read through the node cache, file by file.

        A URL's part is its ``RemoteRecord`` of the group (``remotemeta``: range reads, kept;
        its row types go to ``known``), a local file's is ``csr_sessions`` over it alone
        (without identity when cached: the cache keys the copy); then every file must be CSR
        (the reader's ``configure`` checks or aligns their var indexes). ``None`` when the
        first file's key is not a CSR group.

        Raises:
            ConfigError: Keys beside the matrix (read from local files only, for now), a
                file whose key is not CSR where the first file's is.
        """
        sessions: list[_CSRSession] = []
        for pos, (sid, path) in enumerate(zip(self._ids, self._paths, strict=True)):
            rec = remote.get(pos)
            if rec is None:
                one = self._local_csr(pos, specs[:1])
            elif rec.group is not None:  # a CSR group: its data and indices, as two keys
                known.update({(pos, k): rt for k, rt in enumerate(rec.types)})
                var = None if rec.var is None else list(rec.var)
                one = (rec.record, list(rec.resolved), rec.group, var)
            else:
                one = None
            if one is None:
                if pos == 0:
                    return None
                raise ConfigError(
                    f"key {sessions[0][2].path!r} of session {sid!r} ({path}) is not a CSR "
                    f"matrix, but it is in session {self._ids[0]!r} ({self._paths[0]}): pass "
                    "files of one encoding."
                )
            if len(specs) > 1:
                raise ConfigError(
                    f"key {one[2].path!r} is a sparse matrix of files read through URLs or a "
                    f"node cache, with other keys ({[s.path for s in specs[1:]]}): those are "
                    "read beside it from local files only, for now. Pass key="
                    f"{one[2].path!r} alone, or local files without cache=."
                )
            sessions.append(one)
        parts = sessions[0][1]
        table = VarTableBuilder()
        for one in sessions:
            table.add(one[3], one[2].n_vars)
        return CSRSessions(
            [one[0] for one in sessions],
            parts,
            [one[2] for one in sessions],
            table.table(),
            [],
            specs[0].name,
        )

    def _local_csr(self, pos: int, specs: Sequence[KeySpec]) -> _CSRSession | None:
        """A local file's part of a CSR key (``None``: the key is not a CSR group there)."""
        sources = self._sources
        cached = sources is not None and sources.cached(pos)
        with self._open_for_inspection(pos) as f:
            found = csr_sessions(
                lambda _: contextlib.nullcontext(f),
                [self._ids[pos]],
                [self._paths[pos]],
                specs,
                identity=not cached,
            )
            if found is None:
                return None
            (record,), parts, (group,) = found.records, found.specs, found.groups
            if cached:
                assert sources is not None
                record = cached_record(record, f, parts, sources.cache.layout)
        return record, parts, group, found.var

    def _remote_records(self, specs: Sequence[KeySpec]) -> dict[int, RemoteRecord]:
        """Remote sessions' records (``remotemeta``: range reads, kept in the cache)."""
        sources = self._sources
        infos = {} if sources is None else sources.remote
        if not infos:
            return {}
        assert sources is not None
        return inspect_remote(
            infos,
            self._ids,
            specs,
            self.fields,
            sources.storage_options,
            MetaStore(sources.cache.dir),
            sources.cache.layout,
        )

    def _dense_remote(
        self, found: Mapping[int, RemoteRecord]
    ) -> tuple[
        dict[int, tuple[SessionRecord, list[KeySpec], list[bool]]],
        dict[tuple[int, int], RowType | Exception],
    ]:
        """Remote sessions' records and row types for keys that are not CSR groups."""
        records: dict[int, tuple[SessionRecord, list[KeySpec], list[bool]]] = {}
        known: dict[tuple[int, int], RowType | Exception] = {}
        for pos, rec in found.items():
            if rec.group is not None:
                raise ConfigError(
                    f"key {rec.group.path!r} of session {self._ids[pos]!r} "
                    f"({self._paths[pos]}) is a CSR matrix, but not in session "
                    f"{self._ids[0]!r} ({self._paths[0]}): pass files of one encoding."
                )
            records[pos] = (rec.record, list(rec.resolved), list(rec.uneven))
            known.update({(pos, k): rt for k, rt in enumerate(rec.types)})
        return records, known

    def _canonical(self, records: Sequence[SessionRecord]) -> list[int]:
        """Per session, the first session with the same file (path, symlink or hard link)."""
        seen: dict[tuple[int, int], int] = {}
        canonical = []
        for pos, rec in enumerate(records):
            ident = rec.identity
            if ident is None:
                canonical.append(pos)
                continue
            first = seen.setdefault((ident.device, ident.inode), pos)
            if first != pos:
                warn(
                    f"sessions {self._ids[first]!r} ({self._paths[first]}) and "
                    f"{self._ids[pos]!r} ({self._paths[pos]}) are the same file (same device "
                    "and inode: a repeated path, a symlink or a hard link): its samples appear "
                    "once per session. Remove one of them unless you mean to repeat the file."
                )
            canonical.append(first)
        return canonical

    def _autodetect_key(self) -> str | None:
        sid, path = self._ids[0], self._paths[0]
        info = self._remote_info(0)
        if info is not None:
            assert self._sources is not None
            storage = self._sources
            names = tree_names(info, sid, storage.storage_options, MetaStore(storage.cache.dir))
        else:
            with self._open_for_inspection(0) as f, metadata_errors(sid, path, "the file's tree"):
                names = dataset_names(f, limit=10**9)
        if len(names) == 1:
            return names[0]
        if self._custom_index and not self._item_fast:
            return None  # the subclass reads and indexes on its own
        raise ConfigError(
            f"key=None but session {self._ids[0]!r} ({self._paths[0]}) holds "
            f"{len(names)} datasets {names[:25]}; pass key='<name of the per-sample dataset>', "
            "several as key=('a', 'b'), or a group whose datasets are the samples."
        )

    def choose_cells(self, fn: Any, reader: Reader) -> tuple[np.ndarray, CellChoice]:
        """The packed, read-only index of the cells ``cells=fn`` chose in every file.

        Each file is opened once more, here, for its obs (``cells.choose_cells``).
        """
        return choose_cells(
            fn, self._ids, self._paths, reader.session_rows(), self._open_for_inspection
        )

    def pack(self, index: Any, reader: Reader) -> np.ndarray:
        """The packed, read-only index of what ``build_index`` returned (checked)."""
        records = reader.files.records
        check_rows = self._item_fast and all(rec.layouts for rec in records)
        return pack_index(
            index,
            self._ids,
            row_counts=reader.session_rows() if check_rows else None,
            paths=self._paths,
            key=self._key_name(reader),
        )

    def _key_name(self, reader: Reader) -> str | None:
        specs = reader.files.specs
        return specs[0].path if len(specs) == 1 else None if not specs else str(self.key)


def _beside(n_keys: int, matrix_keys: Sequence[int]) -> list[int]:
    """The keys of ``n_keys`` a matrix part reading ``matrix_keys`` leaves to the row reader.

    Example:
        >>> _beside(4, (0, 1))
        [2, 3]
    """
    return [k for k in range(n_keys) if k not in matrix_keys]
