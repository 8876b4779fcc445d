"""What a dead worker process means: the error that names its pid, its signal and the cause.

A worker killed by a signal is noticed by whichever of torch's channels sees it first: the
``SIGCHLD`` handler ("is killed by signal"), the result queue's liveness check ("exited
unexpectedly"), or a read from the result queue or the resource sharer that fails half-way
(``ConnectionResetError``, ``EOFError``: no pid at all). ``loaderkit.passes`` catches all of
them, finds the dead workers, and raises the one ``RuntimeError`` built here. Pure functions:
nothing here reads processes.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loaderkit._torch import deaths_named, is_worker_exception, may_be_worker_death

__all__ = ["WorkerDeath", "death_message", "deaths_in_message", "is_worker_death_error"]

#: Files named in a message (then "and N more").
_FILES_SHOWN = 3


@dataclass(frozen=True)
class WorkerDeath:
    """One worker that ended while the loader still needed it.

    Attributes:
        worker_id: The worker's index (``get_worker_info().id``), ``None`` when unknown.
        pid: Its process id.
        exitcode: ``multiprocessing.Process.exitcode``: negative for a signal.
    """

    worker_id: int | None
    pid: int | None
    exitcode: int

    @property
    def signal_name(self) -> str | None:
        """``"SIGKILL"``, ``"SIGBUS"``...: the signal that killed it (``None``: it exited)."""
        if self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    def how(self) -> str:
        """``"killed by signal SIGKILL"`` or ``"exited with code 1"``.

        Examples:
            >>> WorkerDeath(0, 12, -9).how()
            'killed by signal SIGKILL'
            >>> WorkerDeath(1, 13, 3).how()
            'exited with code 3'
        """
        name = self.signal_name
        return f"killed by signal {name}" if name else f"exited with code {self.exitcode}"


def is_worker_death_error(error: BaseException) -> bool:
    """Whether ``error`` may be how torch noticed a dead worker (not a worker's own exception).

    A worker's own exception is re-raised by torch with its type and "Caught ... in
    DataLoader worker process N": that is never a death, whatever its type. torch's texts are
    read by ``loaderkit._torch.messages``.

    Examples:
        >>> is_worker_death_error(ConnectionResetError(104, "Connection reset by peer"))
        True
        >>> is_worker_death_error(OSError("Caught OSError in DataLoader worker process 0."))
        False
        >>> is_worker_death_error(RuntimeError("DataLoader worker (pid 7) is killed by signal"))
        True
        >>> is_worker_death_error(RuntimeError("CUDA error"))
        False
    """
    text = str(error)
    if is_worker_exception(text):
        return False
    if isinstance(error, (ConnectionError, EOFError, OSError)):
        return True
    return isinstance(error, RuntimeError) and may_be_worker_death(text)


def _dataset_files(dataset: Any) -> list[str]:
    files = getattr(dataset, "files", None)
    if isinstance(files, Mapping):
        return [str(path) for path in files.values()]
    return []


def _memory_mapped(dataset: Any) -> bool:
    return getattr(dataset, "memory_map", False) is True


def _cause(death: WorkerDeath, dataset: Any) -> str:
    """What a death by this signal usually means, and the fix."""
    name = death.signal_name
    if name == "SIGBUS":
        if _memory_mapped(dataset):
            files = _dataset_files(dataset)
            shown = ", ".join(files[:_FILES_SHOWN])
            if len(files) > _FILES_SHOWN:
                shown += f" and {len(files) - _FILES_SHOWN} more"
            return (
                "the worker died reading memory-mapped files (memory_map=True, or a CSR "
                "matrix's warm batches unless memory_map=False): a file was truncated or "
                "changed while it was mapped"
                + (f" (the dataset's files: {shown})" if shown else "")
                + ". Fix: build the dataset with memory_map=False, or do not rewrite or "
                "truncate its files while training"
            )
        return (
            "a bus error in a worker usually means /dev/shm is too small for the batches in "
            "flight, or a memory-mapped file was truncated. Fix: enlarge /dev/shm (docker run "
            "--shm-size=8g), lower prefetch_factor or num_workers, or call "
            "torch.multiprocessing.set_sharing_strategy('file_system')"
        )
    if name == "SIGKILL":
        return (
            "SIGKILL comes from outside the worker: most often the kernel's out-of-memory "
            "killer (see `dmesg`), a job scheduler, or a user. Fix: lower num_workers, "
            "prefetch_factor or the batch size if memory ran out"
        )
    if name == "SIGSEGV":
        return (
            "a segmentation fault in native code run by the worker (a reading library, a "
            "transform). Rerun with num_workers=0 to see it in the main process"
        )
    return "rerun with num_workers=0 to see the failure in the main process"


def death_message(deaths: Sequence[WorkerDeath], dataset: Any) -> str:
    """The message of the ``RuntimeError`` for workers that died: pids, signals, cause, fix.

    It keeps torch's wording ("DataLoader worker (pid(s) ...) exited unexpectedly"), so code
    that matches torch's message still matches.

    Args:
        deaths: The dead workers (at least one).
        dataset: The loader's dataset (its ``memory_map`` and ``files`` are read, if any).

    Returns:
        The message.

    Examples:
        >>> death_message([WorkerDeath(1, 4242, -9)], None).splitlines()[0]
        'DataLoader worker (pid(s) 4242) exited unexpectedly: worker 1 (pid 4242) was killed by signal SIGKILL.'
    """  # noqa: E501
    pids = ", ".join(str(d.pid) for d in deaths)
    what = "; ".join(
        (f"worker {d.worker_id} (pid {d.pid})" if d.worker_id is not None else f"pid {d.pid}")
        + f" was {d.how()}"
        for d in deaths
    )
    causes = list(dict.fromkeys(_cause(d, dataset) for d in deaths))
    return f"DataLoader worker (pid(s) {pids}) exited unexpectedly: {what}.\n" + "\n".join(
        f"{cause}." for cause in causes
    )


def deaths_in_message(text: str) -> list[WorkerDeath]:
    """The deaths torch's ``SIGCHLD`` handler reported in ``text`` (pid and signal or code).

    Examples:
        >>> deaths_in_message("DataLoader worker (pid 77) is killed by signal: Killed. ")
        [WorkerDeath(worker_id=None, pid=77, exitcode=-9)]
        >>> deaths_in_message("DataLoader worker (pid 5) exited unexpectedly with exit code 3.")
        [WorkerDeath(worker_id=None, pid=5, exitcode=3)]
    """
    return [WorkerDeath(None, pid, code) for pid, code in deaths_named(text)]
