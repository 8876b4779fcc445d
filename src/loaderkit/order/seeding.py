"""Reproducible, collision-free random streams in every process, worker, rank and epoch.

* ``seed_everything`` seeds python ``random``, numpy's legacy global RNG and torch (CPU and
  CUDA) in the calling process.
* ``make_generator`` builds a seeded ``torch.Generator`` (the sampler order).
* ``seed_worker`` is the worker initializer loaderkit installs in every loader (usable as a
  plain ``worker_init_fn`` too): streams differ per worker *and per rank*.
* ``worker_rng`` is the recommended source of randomness for augmentations: a
  ``numpy.random.Generator`` private to the current worker and rank (main process too); a
  worker thread has its own (``loaderkit.workers.threadworkers``).
* ``check_determinism`` compares two loaders built by the same factory.
* ``SampleSeeder`` implements ``sample_seeding=True``: every sample's RNGs are seeded from
  (seed, epoch, index), so batches do not depend on the number of workers.

Worker and epoch seeds are derived with ``numpy.random.SeedSequence`` and per-sample seeds
with a keyed BLAKE2b hash, never by adding small integers; they are passed between processes as
arguments, never through environment variables.
"""

from __future__ import annotations

import gc
import hashlib
import numbers
import os
import random
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.utils.data

from loaderkit import _torch
from loaderkit.errors import check_int
from loaderkit.machine.distributed import process_rank_and_world
from loaderkit.order.determinism import DeterminismReport, check_determinism
from loaderkit.support import support_of
from loaderkit.workers.collate import WorkerMemory
from loaderkit.workers.threadworkers import current_worker
from loaderkit.workers.worker import share_batches

__all__ = [
    "SEED_MAX",
    "DeterminismReport",
    "SampleSeeder",
    "check_determinism",
    "epoch_seed",
    "make_generator",
    "seed_everything",
    "seed_worker",
    "validate_seed",
    "worker_rng",
]

#: Largest accepted seed (seeds are unsigned 64-bit integers).
SEED_MAX = 2**64 - 1

# Spawn-key slots of a worker's SeedSequence: one independent child stream per consumer.
_TORCH, _PYTHON, _NUMPY, _RNG = range(4)
# Spawn key used for the main process (real worker ids are < 2**31).
_MAIN_PROCESS = 2**32 - 1


def validate_seed(seed: Any, name: str = "seed") -> int:
    """Check that ``seed`` is an integer in ``[0, 2**64 - 1]`` and return it as ``int``.

    Args:
        seed: The value to check. ``bool``, ``float``, ``str`` and the like are rejected even
            when they look like integers (``True``, ``3.0``, ``"3"``).
        name: Argument name for the error message.

    Returns:
        ``int(seed)``.

    Raises:
        ArgumentTypeError: When ``seed`` is not an integer (also a ``TypeError``).
        ConfigError: When it is negative or larger than ``2**64 - 1`` (also a ``ValueError``).

    Examples:
        >>> validate_seed(42)
        42
    """
    return check_int(name, seed, minimum=0, maximum=SEED_MAX)


def _words(seed_sequence: np.random.SeedSequence, n: int) -> list[int]:
    return [int(x) for x in seed_sequence.generate_state(n, dtype=np.uint64)]


def epoch_seed(seed: int, epoch: int) -> int:
    """The sampler seed of pass ``epoch`` for a loader built with ``seed``.

    Epoch 0 uses ``seed`` itself (so it matches ``torch.Generator().manual_seed(seed)``); later
    epochs use a 64-bit value derived from ``(seed, epoch)``, so any epoch can be replayed
    alone with ``loader.set_epoch(n)``.

    Examples:
        >>> epoch_seed(7, 0)
        7
        >>> epoch_seed(7, 1) != epoch_seed(7, 2)
        True
    """
    if epoch == 0:
        return seed
    return _words(np.random.SeedSequence(entropy=seed, spawn_key=(epoch,)), 1)[0]


def _seed_numpy_legacy(seed: int) -> None:
    if seed < 2**32:
        np.random.seed(seed)
    else:  # the legacy API takes 32-bit words; an array seeds it from all 64 bits
        np.random.seed(np.array([seed & 0xFFFFFFFF, seed >> 32], dtype=np.uint32))


def seed_everything(seed: int, *, deterministic: bool = False) -> int:
    """Seed python ``random``, numpy's global RNG and torch (CPU and every CUDA device).

    Args:
        seed: An int in ``[0, 2**64 - 1]``.
        deterministic: Also make torch pick deterministic kernels: cuDNN benchmark off and
            deterministic on, ``torch.use_deterministic_algorithms(True, warn_only=True)`` and
            ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (when not already set). These settings are
            process-global and stay in force after the call; they can slow training.

    Returns:
        The seed, as an ``int``.

    Raises:
        TypeError: When ``seed`` is not an integer (bool, float and str are rejected).
        ValueError: When it is out of range.

    Examples:
        >>> seed_everything(0)
        0
        >>> import torch; a = torch.rand(1); _ = seed_everything(0); bool(torch.rand(1) == a)
        True
    """
    seed = validate_seed(seed)
    _set_state(None)  # restart worker_rng() of this process (or worker thread) from the seed
    random.seed(seed)
    _seed_numpy_legacy(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device (lazily when CUDA is not initialized)
    if deterministic:
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        torch.use_deterministic_algorithms(True, warn_only=True)
        # cuBLAS needs a fixed workspace for reproducible results (CUDA >= 10.2).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return seed


def make_generator(seed: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with ``seed`` (for samplers and ``generator=``).

    Examples:
        >>> g = make_generator(3)
        >>> torch.randperm(4, generator=g).tolist() == torch.randperm(
        ...     4, generator=make_generator(3)).tolist()
        True
    """
    generator = torch.Generator()
    generator.manual_seed(validate_seed(seed))
    return generator


# --------------------------------------------------------------------------- worker streams


@dataclass
class _RngState:
    pid: int
    key: tuple[int, ...]
    generator: np.random.Generator


_worker_state: _RngState | None = None


def _get_state() -> _RngState | None:
    """The ``worker_rng`` state of this worker thread, else of this process."""
    worker = current_worker()
    if worker is not None:
        return worker.streams
    return _worker_state


def _set_state(state: _RngState | None) -> None:
    global _worker_state
    worker = current_worker()
    if worker is not None:
        worker.streams = state
    else:
        _worker_state = state


def _current_rank() -> int:
    """Global rank seen from inside any process (worker processes included)."""
    return process_rank_and_world()[0]


def _worker_seed_sequence(base_seed: int, worker_id: int, rank: int) -> np.random.SeedSequence:
    return np.random.SeedSequence(entropy=base_seed, spawn_key=(rank, worker_id))


def _install_worker_streams(worker_id: int, base_seed: int, rank: int, world_size: int) -> None:
    """Seed this worker's globals and its ``worker_rng`` from (base seed, worker, rank).

    A worker thread leaves the process's globals alone (the caller's thread and the other
    workers use them too) and seeds its own generators instead.
    """
    sequence = _worker_seed_sequence(base_seed, worker_id, rank)
    children = sequence.spawn(4)
    thread = current_worker()
    if thread is not None and world_size > 1:
        thread.torch_generator.manual_seed(_words(children[_TORCH], 1)[0])
        thread.random.seed(_words(children[_PYTHON], 2)[0])
    elif world_size > 1:
        # Every rank draws the same base seed from identically seeded generators: mix the rank
        # in, or all ranks augment identically.
        torch.manual_seed(_words(children[_TORCH], 1)[0])
        random.seed(_words(children[_PYTHON], 2)[0])
        np.random.seed(children[_NUMPY].generate_state(4, dtype=np.uint32))
    # In a single process torch's own per-worker seeds (base_seed + worker_id for torch and
    # random, a SeedSequence-style state for numpy) are already distinct: keep them, so a
    # dataset gives exactly the batches it gives under torch's DataLoader.
    _set_state(
        _RngState(
            pid=os.getpid(),
            key=(base_seed, rank, worker_id),
            generator=np.random.Generator(np.random.PCG64(children[_RNG])),
        )
    )


def seed_worker(worker_id: int) -> None:
    """Seed a DataLoader worker: distinct streams per worker and per rank, repeatable per seed.

    loaderkit installs this in every loader (before your own ``worker_init_fn``). It can also
    be passed as ``worker_init_fn`` to a plain ``torch.utils.data.DataLoader``. The seeds come
    from ``numpy.random.SeedSequence`` over (torch's base seed for this pass, worker id,
    global rank). In a single-process job torch's own per-worker seeds are kept, so batches are
    exactly torch's; under ``torch.distributed`` with world size > 1 the rank is mixed in, so
    ranks seeded alike still augment differently.

    Args:
        worker_id: The worker's id (torch passes it).

    Examples:
        >>> loader = torch.utils.data.DataLoader(range(4), num_workers=0,
        ...                                      worker_init_fn=seed_worker)
    """
    info = torch.utils.data.get_worker_info()
    if info is None:  # called outside a worker: nothing to seed per worker
        return
    rank, world_size = process_rank_and_world()
    _install_worker_streams(worker_id, _torch.worker_base_seed(info), rank, world_size)


@dataclass(frozen=True)
class WorkerInit:
    """The ``worker_init_fn`` loaderkit installs: ``seed_worker``, then yours.

    The rank and world size are captured in the main process when the loader is built (spawned
    workers have no process group to ask) and travel as plain attributes.

    Attributes:
        rank: Global rank of the process that built the loader.
        world_size: World size at that time.
        user_fn: The caller's ``worker_init_fn`` (runs after seeding), or ``None``.
        shared_batches: The loader's ``collate_fn`` returns natively read batches as they are
            (``loaderkit.workers.collate.collate``): the worker then allocates them in shared
            memory where no batch slot serves. A worker process hands its dataset its
            ``WorkerMemory`` (``LoaderSupport.use_batch_memory``) as it starts.
        freeze_gc: Call ``gc.freeze()`` first, so the worker's garbage collector never writes
            to the objects it inherited (``loaderkit.policy.memory.resolve_gc_freeze``).
    """

    rank: int = 0
    world_size: int = 1
    user_fn: Callable[[int], Any] | None = None
    shared_batches: bool = False
    freeze_gc: bool = False

    def __call__(self, worker_id: int) -> None:
        thread = current_worker() is not None  # a worker thread: the process is the caller's
        if self.freeze_gc and not thread:
            gc.freeze()
        info = torch.utils.data.get_worker_info()
        if info is not None:
            _install_worker_streams(
                worker_id, _torch.worker_base_seed(info), self.rank, self.world_size
            )
        if not thread:
            share_batches(self.shared_batches)
            if info is not None:  # where this worker writes its batches, handed to the dataset
                support_of(info.dataset).use_batch_memory(WorkerMemory(self.shared_batches))
        if self.user_fn is not None:
            self.user_fn(worker_id)


def _main_process_key() -> tuple[int, ...]:
    return (torch.initial_seed(), _current_rank(), _MAIN_PROCESS)


def worker_rng() -> np.random.Generator:
    """The ``numpy.random.Generator`` of the current worker and rank (main process too).

    Use it for augmentations: its stream differs between workers and ranks, repeats for the
    same seed, and (with ``sample_seeding=True``) is seeded per sample. In the main process it
    follows ``torch.manual_seed`` / ``seed_everything``: reseeding torch restarts it.

    Returns:
        A generator private to this process.

    Examples:
        >>> _ = seed_everything(1); a = worker_rng().random()
        >>> _ = seed_everything(1); bool(worker_rng().random() == a)
        True
    """
    if _sample_stream.active:
        return _sample_stream.get()
    pid = os.getpid()
    info = torch.utils.data.get_worker_info()
    if info is not None:
        state = _get_state()
        if state is None or state.pid != pid:
            # A worker of a plain torch DataLoader (no seed_worker): derive from torch's seed.
            _install_worker_streams(info.id, _torch.worker_base_seed(info), _current_rank(), 1)
            state = _get_state()
        assert state is not None
        return state.generator
    key = _main_process_key()
    state = _get_state()
    if state is None or state.pid != pid or state.key != key:
        sequence = np.random.SeedSequence(entropy=key[0], spawn_key=key[1:])
        state = _RngState(
            pid=pid, key=key, generator=np.random.Generator(np.random.PCG64(sequence))
        )
        _set_state(state)
    return state.generator


# --------------------------------------------------------------------------- per-sample seeds

_SAMPLE_PERSON = b"loaderkit-sample"  # domain separation for the per-sample hash


class _SampleStream(threading.local):
    """The ``worker_rng`` of the sample being produced; re-stated lazily per sample.

    One per thread: worker threads produce samples at the same time.
    """

    def __init__(self) -> None:
        self.bit_generator = np.random.PCG64(0)
        self.generator = np.random.Generator(self.bit_generator)
        self.words: bytes | None = None  # state/increment of the current sample, not yet applied
        self.active = False

    def get(self) -> np.random.Generator:
        if self.words is not None:
            state = int.from_bytes(self.words[:16], "little")
            inc = int.from_bytes(self.words[16:], "little") | 1  # PCG increments are odd
            self.bit_generator.state = {
                "bit_generator": "PCG64",
                "state": {"state": state, "inc": inc},
                "has_uint32": 0,
                "uinteger": 0,
            }
            self.words = None
        return self.generator


_sample_stream = _SampleStream()


class SampleSeeder:
    """Seeds every RNG from (seed, epoch, index) while one sample is produced.

    Used by ``sample_seeding=True``. Before each sample, python ``random``, numpy's global RNG,
    torch's CPU generator and ``worker_rng`` are seeded from a BLAKE2b hash of
    ``(seed, epoch, index)`` (a keyed hash gives independent streams for neighbouring indices
    at a fraction of the cost of a ``SeedSequence``). In a worker process the globals are left
    in that state; in the main process (``num_workers=0``) they are saved before a batch and
    restored after it, so the training loop's own random state (dropout, ...) is untouched. In a
    worker thread the process's RNGs belong to the training loop and the other workers: the
    thread's own generators are seeded instead, with the same values (its ``torch.Generator``,
    what ``torch.thread_safe_generator()`` returns there, and its ``random.Random``), so draws
    from them match those from torch's and Python's global RNGs with 0 workers or processes.

    Args:
        seed: The loader's seed.

    Examples:
        >>> seeder = SampleSeeder(0)
        >>> with seeder.seeded(epoch=0, index=5):
        ...     a = torch.rand(1)
        >>> with seeder.seeded(epoch=0, index=5):
        ...     bool(torch.rand(1) == a)
        True
    """

    def __init__(self, seed: int) -> None:
        self.seed = validate_seed(seed)

    def batch(self) -> _SeededBatch:
        """Context manager around the samples of one batch (saves/restores main-process RNGs)."""
        return _SeededBatch()

    def seed_sample(self, epoch: int, index: Any) -> None:
        """Seed every RNG for sample ``index`` of pass ``epoch`` (inside ``batch``)."""
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, numbers.Integral):
            raise TypeError(
                f"sample_seeding needs integer dataset indices, got {type(index).__name__} "
                f"{index!r}; use a sampler that yields ints or turn sample_seeding off"
            )
        digest = hashlib.blake2b(
            struct.pack("<QQq", self.seed, int(epoch), int(index)),
            digest_size=52,
            person=_SAMPLE_PERSON,
        ).digest()
        thread = current_worker()
        if thread is not None:  # the process's RNGs are the caller's: the thread's own ones
            thread.torch_generator.manual_seed(int.from_bytes(digest[0:8], "little"))
            thread.random.seed(int.from_bytes(digest[8:16], "little"))
        else:
            # torch.manual_seed() would also seed every accelerator backend (~50x slower);
            # samples are produced on the CPU, so the CPU generator is the one that matters.
            torch.default_generator.manual_seed(int.from_bytes(digest[0:8], "little"))
            random.seed(int.from_bytes(digest[8:16], "little"))
            np.random.seed(int.from_bytes(digest[16:20], "little"))
        _sample_stream.words = digest[20:52]
        _sample_stream.active = True

    def seeded(self, epoch: int, index: Any) -> _SeededSample:
        """Context manager: ``batch`` around ``seed_sample`` for one sample."""
        return _SeededSample(self, epoch, index)


class _SeededBatch:
    __slots__ = ("_saved",)

    def __init__(self) -> None:
        self._saved: tuple[Any, ...] | None = None

    def __enter__(self) -> None:
        if torch.utils.data.get_worker_info() is None:
            self._saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())

    def __exit__(self, *exc: object) -> None:
        _sample_stream.active = False
        _sample_stream.words = None
        if self._saved is not None:
            py_state, np_state, torch_state = self._saved
            random.setstate(py_state)
            np.random.set_state(np_state)
            torch.set_rng_state(torch_state)
            self._saved = None


class _SeededSample:
    __slots__ = ("_batch", "_epoch", "_index", "_seeder")

    def __init__(self, seeder: SampleSeeder, epoch: int, index: Any) -> None:
        self._seeder = seeder
        self._epoch = epoch
        self._index = index
        self._batch = _SeededBatch()

    def __enter__(self) -> None:
        self._batch.__enter__()
        try:
            self._seeder.seed_sample(self._epoch, self._index)
        except BaseException:
            self._batch.__exit__(None, None, None)
            raise

    def __exit__(self, *exc: object) -> None:
        self._batch.__exit__(*exc)
