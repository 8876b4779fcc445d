"""Module-level datasets, samplers and functions for tests.

Everything that crosses into a spawned or forkserver worker must be importable by name, so it
lives here rather than inside test functions.
"""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, Sampler

from loaderkit import _torch, worker_rng
from loaderkit.memory.resources import worker_processes

# ---------------------------------------------------------------- test tiers

#: Every start method, in the order torch documents them.
START_METHODS = ("fork", "spawn", "forkserver")


def tiered(values: Any, fast: Any, *, ids: Any = None) -> list[Any]:
    """``values`` as parameters; those not in ``fast`` are marked ``slow`` (``pytest -m slow``).

    The README's test command (the fast tier) keeps one cell per distinct code path; the cells
    that take a path another fast cell already takes (another start method that pickles the
    same way, another case read the same way) run in the slow tier, which CI runs too. Tuples
    are unpacked into several arguments. A caller says in a comment which path each fast cell
    covers.

    Example:
        >>> [bool(p.marks) for p in tiered(["fork", "spawn", "forkserver"], {"fork", "spawn"})]
        [False, False, True]
    """
    params = []
    for n, value in enumerate(values):
        args = value if isinstance(value, tuple) else (value,)
        marks = () if value in fast else (pytest.mark.slow,)
        params.append(pytest.param(*args, marks=marks, id=None if ids is None else ids[n]))
    return params


# ---------------------------------------------------------------- datasets


class SquareDataset(Dataset):
    """Sample i is (i, i*i) as tensors: deterministic content, tuple structure."""

    def __init__(self, n: int = 10) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return torch.tensor(i), torch.tensor(i * i)


class DictDataset(Dataset):
    """Sample i is a dict (exercises default_collate's mapping branch)."""

    def __init__(self, n: int = 9) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": torch.full((2,), float(i)), "id": i, "name": f"s{i}"}


class RandomDataset(Dataset):
    """Sample i draws from every RNG a worker has; returns the draws plus who drew them."""

    def __init__(self, n: int = 8) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        info = torch.utils.data.get_worker_info()
        return torch.tensor(
            [
                float(i),
                random.random(),
                float(np.random.rand()),
                float(torch.rand(1)),
                float(worker_rng().random()),
                -1.0 if info is None else float(info.id),
            ],
            dtype=torch.float64,
        )


class EpochRecordingDataset(SquareDataset):
    """Records set_epoch calls (in the process that receives them)."""

    def __init__(self, n: int = 6) -> None:
        super().__init__(n)
        self.epochs: list[int] = []
        self.epoch = -1

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)
        self.epoch = epoch

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(i), torch.tensor(self.epoch)


class ClosableDataset(SquareDataset):
    def __init__(self, n: int = 6) -> None:
        super().__init__(n)
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


class CountingIterable(IterableDataset):
    def __init__(self, n: int = 7) -> None:
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is None:
            yield from range(self.n)
        else:
            yield from range(info.id, self.n, info.num_workers)


class Transform:
    def __init__(self, fn: Any) -> None:
        self.fn = fn


class TransformDataset(SquareDataset):
    """Holds an arbitrary object under .transform (to plant unpicklable leaves)."""

    def __init__(self, transform: Any, n: int = 4) -> None:
        super().__init__(n)
        self.transform = transform


class LargeArrayDataset(Dataset):
    def __init__(self, nbytes: int) -> None:
        self.data = np.zeros(nbytes, dtype=np.uint8)

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return int(self.data[i])


class PidDataset(Dataset):
    """Returns the pid of the process that produced each sample."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> int:
        return os.getpid()


class SlowDataset(Dataset):
    """Sleeps per sample (keeps workers busy so a test can act mid-epoch)."""

    def __init__(self, n: int = 64, delay: float = 0.01) -> None:
        self.n = n
        self.delay = delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(self.delay)
        return i


# ---------------------------------------------------------------- samplers & functions


class RecordingSampler(Sampler[int]):
    def __init__(self, n: int) -> None:
        self.n = n
        self.epochs: list[int] = []

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


class ReverseSampler(Sampler[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))

    def __len__(self) -> int:
        return self.n


def tuple_collate(batch: list[Any]) -> tuple[Any, ...]:
    """A custom collate_fn: keeps samples as a tuple."""
    return tuple(batch)


WORKER_FLAG = {"value": None}


def set_worker_flag(worker_id: int) -> None:
    """A user worker_init_fn: leaves a mark the dataset can read."""
    WORKER_FLAG["value"] = 100 + worker_id


class FlagDataset(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return -1 if WORKER_FLAG["value"] is None else int(WORKER_FLAG["value"])


def seed_probe(worker_id: int) -> None:
    """worker_init_fn used to observe what seeds the worker ended with."""
    WORKER_FLAG["value"] = torch.initial_seed()


# ---------------------------------------------------------------- process helpers


def child_pids() -> set[int]:
    return {p.pid for p in worker_processes()}


def wait_children_gone(before: set[int], timeout: float = 10.0) -> set[int]:
    """Wait until no child beyond `before` is alive; return the ones left."""
    deadline = time.monotonic() + timeout
    while True:
        extra = {p.pid for p in worker_processes() if p.pid not in before}
        if not extra or time.monotonic() > deadline:
            return extra
        time.sleep(0.05)


def workers_of(method: str) -> set[Any]:
    """Live loader workers of this process: child pids, or ``loaderkit-worker-N`` threads."""
    if method == "thread":
        return {t for t in threading.enumerate() if t.name.startswith("loaderkit-worker-")}
    return child_pids()


def wait_workers_gone(method: str, before: set[Any], timeout: float = 10.0) -> set[Any]:
    """Wait until no worker of ``method`` beyond ``before`` is alive; return the ones left."""
    deadline = time.monotonic() + timeout
    while True:
        extra = workers_of(method) - before
        if not extra or time.monotonic() > deadline:
            return extra
        time.sleep(0.05)


LOCK = threading.Lock()


# ---------------------------------------------------------------- HDF5 fault injection


def write_h5_sessions(
    root: os.PathLike[str] | str, sessions: int = 3, rows: int = 40, width: int = 16
) -> list[str]:
    """Session files whose row r of session s holds the value s * 1000 + r everywhere."""
    import h5py

    paths = []
    for s in range(sessions):
        path = os.path.join(root, f"betas_session{s + 1:02d}.hdf5")
        data = (s * 1000 + np.arange(rows, dtype=np.float32))[:, None].repeat(width, axis=1)
        with h5py.File(path, "w") as f:
            f.create_dataset("betas", data=data)
        paths.append(path)
    return paths


def _failing_read_base():
    from loaderkit import HDF5SessionDataset

    return HDF5SessionDataset


class FailingSessions(_failing_read_base()):
    """A subclass whose read() raises ValueError on one sample and sleeps forever on another."""

    def __init__(self, *args: Any, bad_row: int = -1, hang_row: int = -1, **kwargs: Any):
        self.bad_row = bad_row
        self.hang_row = hang_row
        super().__init__(*args, **kwargs)

    def read(self, session: Any, row: int) -> Any:
        if row == self.bad_row:
            raise ValueError(f"corrupt trial {row}")
        if row == self.hang_row:
            time.sleep(3600)
        return self.h5dataset(session)[row]


class SharedStateDataset(Dataset):
    """Holds multiprocessing primitives: they pickle only while a worker is being started."""

    def __init__(self, context: str, n: int = 6) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context(context)
        self.n = n
        self.counter = ctx.Value("i", 0)
        self.event = ctx.Event()
        self.semaphore = ctx.Semaphore(2)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        with self.counter.get_lock():
            self.counter.value += 1
        return i


def double(x: int) -> int:
    return 2 * x


# ---------------------------------------------------------------- resume


class AugmentDataset(Dataset):
    """Sample ``i`` is ``(i, torch draw, numpy draw, random draw)``: all three must match."""

    def __init__(self, n: int = 29, log_dir: str | None = None) -> None:
        self.n = n
        self.log_dir = log_dir

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, float, float]:
        if self.log_dir is not None:  # every fetched index, per process (workers included)
            with open(os.path.join(self.log_dir, f"{os.getpid()}.log"), "a") as handle:
                handle.write(f"{int(i)}\n")
        return (torch.tensor(i), torch.rand(2), float(np.random.rand()), random.random())


def fetched_indices(log_dir: str) -> list[int]:
    """Every index ``AugmentDataset(log_dir=...)`` fetched, in any process."""
    found: list[int] = []
    for name in sorted(os.listdir(log_dir)):
        with open(os.path.join(log_dir, name)) as handle:
            found.extend(int(line) for line in handle if line.strip())
    return found


class StatefulIterable(IterableDataset):
    """Yields ``start, start+1, ..., n-1`` then restarts at 0; its position is its state."""

    def __init__(self, n: int = 10) -> None:
        self.n = n
        self.position = 0

    def __iter__(self):
        while self.position < self.n:
            self.position += 1
            yield torch.tensor(self.position - 1)
        self.position = 0

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


class StatefulSampler(torch.utils.data.Sampler[int]):
    """A random sampler with its own ``state_dict`` (its generator's state)."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n = n
        self.generator = torch.Generator().manual_seed(seed)
        self.state_dict_calls = 0
        self.loaded: list[Any] = []

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        yield from torch.randperm(self.n, generator=self.generator).tolist()

    def state_dict(self) -> dict[str, Any]:
        self.state_dict_calls += 1
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loaded.append(state)
        self.generator.set_state(state["generator"])


class GlobalRandomSampler(torch.utils.data.Sampler[int]):
    """A user sampler that draws its order from torch's global generator (no state_dict)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        yield from torch.randperm(self.n).tolist()


#: torch's DataLoader takes ``in_order`` (torch 2.6 and later).
TORCH_HAS_IN_ORDER = "in_order" in _torch.loader_parameters()
#: Marks a test that passes ``in_order=False`` (an older torch refuses it: tested apart).
needs_in_order = pytest.mark.skipif(
    not TORCH_HAS_IN_ORDER, reason="in_order needs torch 2.6 (older: a ConfigError, tested)"
)
