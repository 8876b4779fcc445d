"""Stopping a pass iterator's workers within bounded time, and closing what it holds here.

``shutdown_iterator`` asks torch to stop the workers (its orderly shutdown), terminates then
kills any that do not stop, and ``release_iterator`` closes every descriptor the iterator still
owns in this process. torch leaves those to garbage collection of the iterator, which may never
come while something still refers to it: older torch releases register every worker of a
persistent pinned iterator with ``atexit`` (2 pipe ends per worker held until the interpreter
exits), and a caller, a framework or a traceback may hold the iterator itself.

The iterator's workers and queues are read through ``loaderkit._torch.parts``; everything done
with them here is the standard library's public API.

Examples:
    >>> import torch.utils.data
    >>> shutdown_iterator(iter(torch.utils.data.DataLoader([1, 2])))  # no workers: nothing
"""

from __future__ import annotations

import logging
import queue
from typing import Any

from loaderkit import _torch
from loaderkit.workers.queues import DirectQueue

__all__ = ["KILL_GRACE_S", "release_iterator", "shutdown_iterator"]

logger = logging.getLogger("loaderkit")

#: Seconds to wait for a worker after asking it to stop, then after terminating it.
KILL_GRACE_S = 1.0


def shutdown_iterator(iterator: Any) -> None:
    """Stop an iterator's workers; escalate to terminate/kill; release its descriptors.

    Never raises (a worker that already died is simply reaped).
    """
    workers = _torch.parts(iterator).workers
    if not workers:  # no worker processes: worker threads stop themselves, within bounded time
        try:
            _torch.shutdown_workers(iterator)
        except Exception:  # pragma: no cover - never raise from a shutdown
            logger.debug("loaderkit: stopping worker threads failed", exc_info=True)
        return
    try:
        _torch.shutdown_workers(iterator)
    except Exception:  # a worker that died mid-shutdown: fall through to the hard stop
        logger.debug("loaderkit: orderly worker shutdown failed", exc_info=True)
    for worker in workers:
        try:
            if worker.is_alive():
                worker.terminate()
                worker.join(KILL_GRACE_S)
            if worker.is_alive():
                worker.kill()
                worker.join(KILL_GRACE_S)
        except Exception:  # pragma: no cover - process already reaped
            logger.debug("loaderkit: could not stop worker %s", worker, exc_info=True)
    release_iterator(iterator)


def release_iterator(iterator: Any) -> None:
    """Close every descriptor a stopped iterator still owns in this process; never raise.

    What is released:

    * the pin-memory thread (joined first: it reads the result queue);
    * the result queue and the index queues (multiprocessing queues: one pipe, two ends, each);
      torch closes the result queue only when pinning, and ``Queue.close()`` closes nothing
      in a process that never put on the queue, so the ends are closed here;
    * each reaped worker's ``Popen`` pipe ends (its sentinel): ``Process`` objects stay
      usable (``join``/``is_alive``/``exitcode`` answer from the recorded exit code);
    * batches received but not yet handed out (pinned memory, shared-memory descriptors), and
      the hand-off's slots (the loaderkit hooks' ``shut_down``).
    """
    parts = _torch.parts(iterator)
    queues = list(parts.index_queues)
    thread = parts.pin_thread
    if thread is not None and thread.is_alive():
        if parts.pin_done is not None:
            parts.pin_done.set()
        thread.join(KILL_GRACE_S)
    if thread is None or not thread.is_alive():
        queues.append(parts.result_queue)
    else:  # pragma: no cover - stuck pinning a batch: it still reads the result queue
        logger.debug("loaderkit: pin-memory thread did not stop; the result queue stays open")
    for mp_queue in queues:
        if mp_queue is not None:
            _close_mp_queue(mp_queue)
    if isinstance(parts.data_queue, queue.Queue):  # pinned batches the pin thread had queued
        with parts.data_queue.mutex:
            parts.data_queue.queue.clear()
    if isinstance(parts.pending, dict):  # out-of-order batches held for later
        parts.pending.clear()
    hooks = _torch.hooks_of(iterator)
    if hooks is not None:  # slots: batches the caller holds keep their memory
        hooks.shut_down()
    for worker in parts.workers:
        _release_process(worker)


def _close_mp_queue(mp_queue: Any) -> None:
    """Close both pipe ends of a multiprocessing queue in this process."""
    if isinstance(mp_queue, DirectQueue):
        mp_queue.release()
        return
    try:
        mp_queue.cancel_join_thread()
        mp_queue.close()  # with a feeder thread: it flushes, then closes both ends itself
    except Exception:  # pragma: no cover - already closed or half built
        logger.debug("loaderkit: closing a queue failed", exc_info=True)
    feeder = getattr(mp_queue, "_thread", None)
    if feeder is not None:
        feeder.join(KILL_GRACE_S)
        if feeder.is_alive():  # pragma: no cover - still writing into a full pipe
            return  # closing the ends now would make it fail loudly; it closes them when done
    for end in (getattr(mp_queue, "_reader", None), getattr(mp_queue, "_writer", None)):
        try:
            if end is not None:
                end.close()
        except OSError:  # pragma: no cover - already closed
            pass


def _release_process(worker: Any) -> None:
    """Close the pipe ends multiprocessing keeps for a worker that has been reaped."""
    try:
        if worker.exitcode is None:  # running, or never started: nothing to release safely
            return
        popen = getattr(worker, "_popen", None)
        close = getattr(popen, "close", None)
        if callable(close):
            close()
    except Exception:  # pragma: no cover - a Process already closed by someone else
        logger.debug("loaderkit: could not release worker %s", worker, exc_info=True)
