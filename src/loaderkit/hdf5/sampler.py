"""``BlockShuffleSampler``: a shuffled order that keeps HDF5 reads sequential.

A uniformly shuffled order makes every batch touch as many sessions and rows as it has samples:
one h5py call (microseconds each) per sample, and with a bounded file pool a file reopen for
almost every sample. This sampler shuffles *blocks* of consecutive rows of one session instead,
so a batch of 64 with ``block_size=16`` is four slab reads, and it interleaves the blocks of a
small window of sessions so that neighbouring blocks, and hence batches, still mix sessions.

Each epoch:

1. (ranks) The blocks are split between ``num_replicas`` ranks without overlap: either blocks
   dealt at random (``partition="block"``), or whole sessions, balanced by rows, so each rank
   opens only about ``sessions / num_replicas`` files (``partition="session"``). Every rank gets
   the same number of samples (padding by repeating samples, or ``drop_last``), as
   ``DistributedSampler`` does, because DDP hangs on uneven counts.
2. (order) Sessions enter a window of ``window`` active sessions in a random order; each next
   block is drawn uniformly from the remaining blocks of the active sessions; a finished session
   is replaced by the next one. Rows inside a block stay in file order.

With ``batch_size`` (elastic order, what ``shuffle="block"`` with a ``seed`` builds) step 1 is
different: steps 1 and 2 run once for the whole dataset, as on a single rank, and rank ``r``
reads ``[r * batch_size, (r + 1) * batch_size)`` of every global batch of
``num_replicas * batch_size`` rows (``loaderkit.order.samplers.global_batch_positions``). A rank's
part of a global batch is contiguous in that order, so it is still a few runs of consecutive
rows, and the global batches are the same on any number of ranks.

``block_size=1`` with ``window`` >= number of sessions is exactly a uniform shuffle.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import DistributedSampler

from loaderkit import _torch
from loaderkit.errors import ArgumentTypeError, ConfigError, check_int
from loaderkit.machine.distributed import dist_info
from loaderkit.order.samplers import global_batch_count, global_batch_positions
from loaderkit.order.seeding import validate_seed
from loaderkit.support import answers, support_of

__all__ = ["DEFAULT_BLOCK_SIZE", "BlockShuffleSampler", "fetch_permutation"]

#: Rows per block when ``block_size`` is not given (rounded up to whole chunks for chunked
#: data). Chosen with ``benchmarks/hdf5_read.py`` and ``benchmarks/hdf5_block_size.py``: with
#: batches of 64, 16 rows per block gives 4 slab reads per batch (over 8x per-item reads on
#: small rows) while a batch still spans ~4 sessions; see docs/hdf5.md for the numbers.
DEFAULT_BLOCK_SIZE = 16

_PARTITIONS = ("block", "session")


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenate ``arange(s, s + l)`` for every pair, vectorized."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    offsets = np.cumsum(lengths) - lengths
    return np.arange(total, dtype=np.int64) + np.repeat(starts - offsets, lengths)


class BlockShuffleSampler(DistributedSampler[int]):
    """Shuffle blocks of consecutive rows so batched HDF5 reads stay sequential on disk.

    It is a ``torch.utils.data.DistributedSampler`` (with that class's public attributes:
    ``dataset``, ``num_replicas``, ``rank``, ``epoch``, ``shuffle``, ``seed``, ``drop_last``,
    ``num_samples``, ``total_size``), which is how Lightning and Fabric tell a sampler that
    already shards: they keep it instead of re-wrapping and reshuffling it.

    Yields dataset indices of a dataset with sessions: an ``HDF5SessionDataset``, or any whose
    ``loader_support()`` answers ``session_index()`` (``loaderkit.LoaderSupport``). Blocks hold
    ``block_size`` consecutive rows of one session (in file order); the blocks of ``window``
    sessions at a time are interleaved at random. Epoch-aware (``set_epoch``), reproducible
    from ``seed``, and rank-aware: each rank yields a disjoint share of equal length.

    Args:
        dataset: The dataset whose indices to order (its index tells which rows are contiguous).
        block_size: Rows per block. Default ``DEFAULT_BLOCK_SIZE``, rounded up to a whole
            number of chunks for chunked data so that every chunk is decompressed once. Blocks
            start at row multiples of the block size, so an explicit multiple of the chunk rows
            is chunk-aligned too.
        seed: Base seed (``0 <= seed < 2**64``). ``None`` draws one from torch's global RNG at
            construction (so ``torch.manual_seed`` makes it reproducible); with several replicas
            ``None`` means ``0``, like ``DistributedSampler``, so all ranks agree.
        window: Sessions interleaved at a time. Default: the files the dataset keeps open
            (``SessionIndex.open_files``, its ``max_open_files``: a worker's file pool never
            thrashes), at most the number of sessions. When the dataset holds sessions in
            memory (``SessionIndex.held_sessions``: rows that span many chunks)
            and not all of them fit, at most one less than the sessions it holds (at least
            1): the spare place keeps a finished session from crowding out an active one,
            so each process reads every session once per pass (exactly, with a window of
            1 or every session held).
        num_replicas: Number of ranks. Default from ``loaderkit.machine.distributed.dist_info``.
        rank: This rank. Default from ``loaderkit.machine.distributed.dist_info``.
        drop_last: Drop the tail so the samples divide evenly between ranks instead of padding
            with repeated samples.
        partition: ``"block"`` deals blocks to ranks at random every epoch; ``"session"`` gives
            each rank whole sessions (balanced by rows; at most ``num_replicas - 1`` sessions are
            split between two ranks), fixed for a given seed, so each rank opens fewer files.
        batch_size: Samples per rank per step. When given, the order is elastic: one order of
            the whole dataset, cut into global batches of ``num_replicas * batch_size`` rows,
            rank ``r`` reading part ``r`` of each (the global batches do not depend on
            ``num_replicas``; ``drop_last`` then drops the last, partial global batch, and
            without it that batch is split evenly between the ranks). Needs
            ``partition="block"``. With one replica the order is the same with or without it.
        fetch_factor: A buffered block shuffle (scDataset's ``fetch_factor``): the order's
            blocks are cut into fetches of ``fetch_factor`` global batches (``fetch_factor *
            num_replicas * batch_size`` rows), and the rows of each fetch are permuted
            together, so a batch draws its rows from the many blocks of its fetch while each
            block stays one contiguous run of the fetch. ``None`` (default): batches are runs
            of blocks. Needs ``batch_size``; the mix it gives is ``loaderkit.order_mix``'s.

    Example:
        >>> sampler = BlockShuffleSampler(ds, seed=0)  # doctest: +SKIP
        >>> loader = DataLoader(ds, batch_size=64, sampler=sampler)  # doctest: +SKIP
        >>> for epoch in range(3):  # doctest: +SKIP
        ...     sampler.set_epoch(epoch)
        ...     for batch in loader: ...
    """

    def __init__(
        self,
        dataset: Any,
        *,
        block_size: int | None = None,
        seed: int | None = None,
        window: int | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
        partition: str = "block",
        batch_size: int | None = None,
        fetch_factor: int | None = None,
    ) -> None:
        support = support_of(dataset)
        if not answers(support, "session_index"):
            raise ArgumentTypeError(
                "BlockShuffleSampler needs a dataset with sessions: an HDF5SessionDataset, or "
                "one whose loader_support() answers session_index() (loaderkit.LoaderSupport; "
                f"it says which rows are contiguous), got {type(dataset).__name__}."
            )
        if partition not in _PARTITIONS:
            raise ConfigError(f"partition must be one of {_PARTITIONS}, got {partition!r}.")
        if batch_size is not None and partition != "block":
            raise ConfigError(
                "batch_size (an elastic order cut into global batches) needs "
                f"partition='block', got partition={partition!r}: whole sessions per rank "
                "depend on the number of ranks."
            )
        if fetch_factor is not None and batch_size is None:
            raise ConfigError(
                f"fetch_factor={fetch_factor!r} permutes the rows of fetch_factor batches "
                "together: pass batch_size= too (the loader's batch size, per rank)."
            )
        self.fetch_factor = (
            None if fetch_factor is None else check_int("fetch_factor", fetch_factor, minimum=1)
        )
        if num_replicas is None or rank is None:
            info = dist_info()
            num_replicas = info.world_size if num_replicas is None else num_replicas
            rank = info.rank if rank is None else rank
        self.num_replicas = check_int("num_replicas", num_replicas, minimum=1)
        self.rank = check_int("rank", rank, minimum=0)
        if self.rank >= self.num_replicas:
            raise ConfigError(
                f"rank must be in [0, num_replicas - 1] = [0, {self.num_replicas - 1}], "
                f"got {self.rank}."
            )
        self.seed = self._resolve_seed(seed)
        self.drop_last = bool(drop_last)
        self.partition = partition
        self.epoch = 0
        self.dataset = dataset
        self.shuffle = True

        index = support.session_index()
        if index is None:
            raise ArgumentTypeError(
                f"{type(dataset).__name__}.loader_support().session_index() returned None: "
                "BlockShuffleSampler needs the session and row of every sample."
            )
        pos = np.asarray(index.positions, dtype=np.int64)
        rows = np.asarray(index.rows, dtype=np.int64)
        n_sessions = index.sessions
        chunk_rows = np.maximum(np.asarray(index.chunk_rows, dtype=np.int64), 1)
        if block_size is None:
            self.block_size = DEFAULT_BLOCK_SIZE
            block_rows = -(-DEFAULT_BLOCK_SIZE // chunk_rows) * chunk_rows
        else:
            self.block_size = check_int("block_size", block_size, minimum=1)
            block_rows = np.full(n_sessions, self.block_size, np.int64)
        self._block_rows = block_rows

        # Dataset indices grouped by session, rows ascending; then cut into blocks.
        n = pos.shape[0]
        self._num_samples_total = n
        if n > 1 and not bool(
            np.all((pos[1:] > pos[:-1]) | ((pos[1:] == pos[:-1]) & (rows[1:] >= rows[:-1])))
        ):
            order = np.lexsort((rows, pos))
        else:
            order = np.arange(n, dtype=np.int64)
        s, r = pos[order], rows[order]
        key = r // block_rows[s] if n else r
        brk = np.flatnonzero((s[1:] != s[:-1]) | (r[1:] - r[:-1] != 1) | (key[1:] != key[:-1]))
        starts = np.concatenate(([0], brk + 1)) if n else np.zeros(0, np.int64)
        self._order = order.astype(np.int64)
        self._unit_start = starts.astype(np.int64)
        self._unit_len = np.diff(np.append(starts, n)).astype(np.int64)
        self._unit_sess = s[starts] if n else np.zeros(0, np.int64)
        present = int(np.unique(self._unit_sess).size)
        if window is None:
            cap = index.open_files or present
            held = index.held_sessions
            if held is not None and 0 < held < present:
                cap = min(cap, max(1, held - 1))
            self.window = max(1, min(cap, present))
        else:
            self.window = check_int("window", window, minimum=1)
        self.batch_size = (
            None if batch_size is None else check_int("batch_size", batch_size, minimum=1)
        )
        if self.batch_size is not None:
            self._per_rank = global_batch_count(
                n, self.batch_size, self.num_replicas, self.rank, self.drop_last
            )
        elif self.drop_last:
            self._per_rank = n // self.num_replicas
        else:
            self._per_rank = -(-n // self.num_replicas)

    def _resolve_seed(self, seed: int | None) -> int:
        if seed is None:
            if self.num_replicas > 1:
                return 0
            return _torch.draw_seed()  # as RandomSampler draws its own
        return validate_seed(seed)

    @property
    def block_rows(self) -> tuple[int, ...]:
        """Rows per block of every session (``block_size``, or the default rounded to chunks)."""
        return tuple(int(b) for b in self._block_rows)

    @property
    def num_blocks(self) -> int:
        """Number of blocks over the whole dataset (before splitting between ranks)."""
        return int(self._unit_start.shape[0])

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` for the next iteration (call before every epoch).

        Example:
            >>> sampler.set_epoch(3)  # doctest: +SKIP
        """
        self.epoch = check_int("epoch", epoch, minimum=0)

    def __len__(self) -> int:
        return self._per_rank

    @property
    def num_samples(self) -> int:  # type: ignore[override]
        """Samples this rank yields per epoch (``DistributedSampler``'s attribute)."""
        return self._per_rank

    @property
    def total_size(self) -> int:  # type: ignore[override]
        """Samples all ranks yield per epoch, padding included (``DistributedSampler``'s)."""
        if self.batch_size is None:
            return self._per_rank * self.num_replicas
        n = self._num_samples_total
        return sum(
            global_batch_count(n, self.batch_size, self.num_replicas, r, self.drop_last)
            for r in range(self.num_replicas)
        )

    @property
    def elastic(self) -> bool:
        """True when the order is elastic (``batch_size`` given): global batches shared by ranks."""
        return self.batch_size is not None

    def order_key(self) -> dict[str, Any]:
        """What, besides ``seed`` and the dataset, decides the elastic order (resume checks it).

        The block layout (rows per block of every session, as a digest), the ``window``, and
        the ``fetch_factor`` where one is given.

        Example:
            >>> sampler.order_key()  # doctest: +SKIP
            {'kind': 'block', 'block_rows': '5f0c...', 'window': 4}
        """
        digest = hashlib.sha256(np.ascontiguousarray(self._block_rows).tobytes()).hexdigest()
        key: dict[str, Any] = {"kind": "block", "block_rows": digest[:16], "window": self.window}
        if self.fetch_factor is not None:
            key["fetch_factor"] = self.fetch_factor
        return key

    @property
    def global_batch_size(self) -> int | None:
        """``num_replicas * batch_size`` in the elastic order, else ``None``."""
        return None if self.batch_size is None else self.batch_size * self.num_replicas

    def _rng(self, *stream: int) -> np.random.Generator:
        return np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=stream))

    def _rank_units(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This rank's pieces of blocks: (start into ``_order``, length, session position)."""
        n = self._num_samples_total
        units = self._unit_start.shape[0]
        if self.partition == "session":
            # Fixed for the seed: sessions in a random order, blocks in file order, then cut
            # into equal contiguous shares (balanced by rows).
            rng = self._rng(0)
            sess_rank = np.empty(int(np.max(self._unit_sess)) + 1 if units else 0, np.int64)
            present = np.unique(self._unit_sess)
            sess_rank[present] = rng.permutation(present.shape[0])
            seq = np.argsort(sess_rank[self._unit_sess], kind="stable")
        else:
            seq = self._rng(1, self.epoch).permutation(units)
        if self.num_replicas == 1 and not self.drop_last:
            return self._unit_start[seq], self._unit_len[seq], self._unit_sess[seq]
        lengths = self._unit_len[seq]
        ends = np.cumsum(lengths)
        lo = self.rank * self._per_rank
        hi = lo + self._per_rank
        # Walk [lo, hi) over the concatenation repeated as often as padding needs.
        starts_out, lens_out, sess_out = [], [], []
        pos = lo
        while pos < hi and n:
            lap, off = divmod(pos, n)
            k = int(np.searchsorted(ends, off, side="right"))  # block containing `off`
            first = k
            # Blocks fully or partly inside [off, min(n, off + hi - pos)).
            stop_off = min(n, off + (hi - pos))
            last = int(np.searchsorted(ends, stop_off, side="left"))
            ks = seq[first : last + 1]
            block_begin = ends[first : last + 1] - lengths[first : last + 1]
            cut_lo = np.maximum(block_begin, off) - block_begin
            cut_hi = np.minimum(ends[first : last + 1], stop_off) - block_begin
            keep = cut_hi > cut_lo
            starts_out.append(self._unit_start[ks][keep] + cut_lo[keep])
            lens_out.append((cut_hi - cut_lo)[keep])
            sess_out.append(self._unit_sess[ks][keep])
            pos = lap * n + stop_off
        if not starts_out:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty
        return np.concatenate(starts_out), np.concatenate(lens_out), np.concatenate(sess_out)

    def _window_order(self, sess: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Order of this rank's blocks: a random interleaving of a sliding session window."""
        units = sess.shape[0]
        if units == 0:
            return np.zeros(0, np.int64)
        present, inverse = np.unique(sess, return_inverse=True)
        session_rank = rng.permutation(present.shape[0])
        shuffled = rng.permutation(units)
        grouped = shuffled[np.argsort(session_rank[inverse[shuffled]], kind="stable")]
        counts = np.bincount(session_rank[inverse], minlength=present.shape[0]).tolist()
        bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
        window = min(self.window, present.shape[0])
        if window >= present.shape[0]:
            # All sessions active: uniform over all remaining blocks = a plain permutation.
            return shuffled
        # Active slots as [next, end] positions into `grouped`.
        slots = [[bounds[i], bounds[i + 1]] for i in range(window)]
        next_session = window
        total = bounds[window]
        draws = np.asarray(rng.random(units)).tolist()
        grouped_list = grouped.tolist()
        out = np.empty(units, np.int64)
        for t in range(units):
            x = int(draws[t] * total)
            for slot in slots:
                c = slot[1] - slot[0]
                if x < c:
                    break
                x -= c
            out[t] = grouped_list[slot[0]]
            slot[0] += 1
            total -= 1
            if slot[0] == slot[1]:
                slots.remove(slot)
                if next_session < present.shape[0]:
                    slots.append([bounds[next_session], bounds[next_session + 1]])
                    total += counts[next_session]
                    next_session += 1
        return out

    def global_indices(self) -> np.ndarray:
        """The whole epoch's order, as one rank alone would read it (the same on every rank).

        What the elastic order (``batch_size``) cuts into global batches; with one replica
        and no ``batch_size`` it is also what ``indices()`` returns.

        Example:
            >>> sampler.global_indices()[:4]  # doctest: +SKIP
            array([4816, 4817, 4818, 4819])
        """
        units = self._unit_start.shape[0]
        seq = self._rng(1, self.epoch).permutation(units)
        order = self._window_order(self._unit_sess[seq], self._rng(2, self.epoch, 0))
        picked = seq[order]
        found = self._order[_ranges(self._unit_start[picked], self._unit_len[picked])]
        if self.fetch_factor is None or self.global_batch_size is None:
            return found
        fetch = self.fetch_factor * self.global_batch_size
        return found[fetch_permutation(found.size, fetch, self._rng(3, self.epoch))]

    def indices(self) -> np.ndarray:
        """Return this rank's indices for the current epoch as an array (what ``iter`` yields).

        Example:
            >>> sampler.indices()[:4]  # doctest: +SKIP
            array([4816, 4817, 4818, 4819])
        """
        if self.batch_size is not None:
            positions = global_batch_positions(
                self._num_samples_total,
                self.batch_size,
                self.num_replicas,
                self.rank,
                self.drop_last,
            )
            return self.global_indices()[positions]
        starts, lengths, sess = self._rank_units()
        order = self._window_order(sess, self._rng(2, self.epoch, self.rank))
        return self._order[_ranges(starts[order], lengths[order])]

    def __iter__(self) -> Iterator[int]:
        yield from self.indices().tolist()


def fetch_permutation(n: int, fetch: int, rng: np.random.Generator) -> np.ndarray:
    """Positions ``0..n-1`` permuted within each run of ``fetch`` (the last may be shorter).

    What a buffered block shuffle does to an order of blocks: each fetch's rows are mixed
    together, no row leaves its fetch. ``O(n log fetch)``: one sort per fetch, all at once.

    Example:
        >>> import numpy as np
        >>> got = fetch_permutation(10, 4, np.random.default_rng(0))
        >>> [sorted(got[i : i + 4].tolist()) for i in (0, 4, 8)]
        [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    """
    full, tail = divmod(n, fetch)
    out = np.empty(n, np.int64)
    if full:
        within = np.argsort(rng.random((full, fetch)), axis=1)
        out[: full * fetch] = (within + np.arange(full)[:, None] * fetch).reshape(-1)
    if tail:
        out[full * fetch :] = full * fetch + rng.permutation(tail)
    return out
