"""A worker killed by a signal always surfaces as a RuntimeError naming its pid and signal."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset

from loaderkit import HDF5SessionDataset, create_dataloader
from loaderkit.workers.deaths import WorkerDeath, death_message, is_worker_death_error
from tests.hdf5.helpers import write_sessions
from tests.helpers import child_pids, wait_children_gone


class SlowSamples(Dataset[torch.Tensor]):
    """Samples that take a moment, large enough that batches travel in shared memory."""

    def __len__(self) -> int:
        return 4000

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.001)
        return torch.full((2048,), float(index))


def _kill_mid_epoch(context: str, rng: random.Random) -> tuple[BaseException, int]:
    before = child_pids()
    loader = create_dataloader(
        SlowSamples(), batch_size=4, num_workers=2, multiprocessing_context=context
    )
    iterator = iter(loader)
    for _ in range(rng.randint(1, 4)):
        next(iterator)
    victim = rng.choice(sorted(child_pids() - before))
    time.sleep(rng.random() * 0.01)  # anywhere in a worker's read, put or send
    os.kill(victim, signal.SIGKILL)
    try:
        for _ in iterator:
            pass
    except BaseException as error:
        caught: BaseException = error
    else:  # pragma: no cover - the assertion below reports it
        caught = AssertionError("the epoch ended although a worker was killed")
    loader.close()
    assert wait_children_gone(before) == set()
    return caught, victim


@pytest.mark.parametrize(
    ("context", "trials"),
    # fast: 1 forked trial (the kill, the message and the teardown are the same under every
    # start method); slow: 27 forked trials (every victim position) and 3 spawned ones
    [
        ("fork", 1),
        pytest.param("fork", 27, marks=pytest.mark.slow),
        pytest.param("spawn", 3, marks=pytest.mark.slow),
    ],
)
def test_every_sigkill_names_the_pid_and_the_signal(context: str, trials: int) -> None:
    rng = random.Random(23)
    for trial in range(trials):
        error, victim = _kill_mid_epoch(context, rng)
        assert isinstance(error, RuntimeError), f"trial {trial}: {type(error).__name__}: {error}"
        message = str(error)
        assert f"pid(s) {victim})" in message and "exited unexpectedly" in message, message
        assert "killed by signal SIGKILL" in message, message


def test_a_killed_forkserver_worker_is_reported_before_the_loader_timeout() -> None:
    # A forkserver's workers are not this process's children: no SIGCHLD tells the loader one
    # died, so it must look for itself while it waits, not only once timeout=30 has passed.
    before = child_pids()
    loader = create_dataloader(
        SlowSamples(), batch_size=4, num_workers=2, multiprocessing_context="forkserver", timeout=30
    )
    iterator = iter(loader)
    next(iterator)
    victim = min(child_pids() - before)
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    with pytest.raises(RuntimeError, match="killed by signal SIGKILL") as info:
        for _ in iterator:
            pass
    waited = time.monotonic() - killed
    loader.close()
    assert f"pid(s) {victim})" in str(info.value)
    assert waited < 20, f"reported {waited:.1f} s after the kill (the loader's timeout is 30 s)"
    assert wait_children_gone(before) == set()


def test_sigbus_in_a_memory_mapped_dataset_names_the_maps_and_files(tmp_path: Path) -> None:
    paths = write_sessions(tmp_path, [400, 400])
    dataset = HDF5SessionDataset(paths, key="betas", memory_map=True)
    before = child_pids()
    loader = create_dataloader(dataset, batch_size=2, num_workers=2, seed=0, sample_seeding=True)
    iterator = iter(loader)
    next(iterator)
    victim = sorted(child_pids() - before)[0]
    os.kill(victim, signal.SIGBUS)
    with pytest.raises(RuntimeError) as info:
        for _ in iterator:
            pass
    message = str(info.value)
    assert f"pid(s) {victim})" in message and "SIGBUS" in message
    assert "memory-mapped" in message and str(paths[0]) in message
    assert "memory_map=False" in message
    loader.close()
    assert wait_children_gone(before) == set()


def test_the_messages() -> None:
    segv = death_message([WorkerDeath(0, 11, -signal.SIGSEGV)], None)
    assert "pid(s) 11" in segv and "SIGSEGV" in segv and "num_workers=0" in segv
    bus = death_message([WorkerDeath(1, 12, -signal.SIGBUS)], object())
    assert "/dev/shm" in bus  # no memory maps: torch's usual cause
    exited = death_message([WorkerDeath(0, 13, 1), WorkerDeath(1, 14, -9)], None)
    assert "pid(s) 13, 14" in exited and "exited with code 1" in exited
    # A worker's own exception, re-raised by torch with its type, is never a death.
    assert not is_worker_death_error(OSError("Caught OSError in DataLoader worker process 1."))
    assert is_worker_death_error(EOFError())
