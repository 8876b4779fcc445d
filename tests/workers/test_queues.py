"""``DirectQueue``: small messages written by the putting thread, order kept, never blocking.

Real pipes and real processes (fork, spawn, forkserver). No test measures speed
(``benchmarks/handoff.py`` does).
"""

from __future__ import annotations

import gc
import multiprocessing
import queue
import threading
import time
from typing import Any

import pytest
import torch

from loaderkit import create_dataloader
from loaderkit.workers.queues import DirectContext, DirectQueue, direct_writes_possible
from tests.conftest import fake_platform
from tests.helpers import START_METHODS, tiered

pytestmark = pytest.mark.skipif(not direct_writes_possible(), reason="Linux pipes only")

#: The raw queue: fork in the fast tier (a spawned writer takes the same pickled-descriptor
#: path as the slot loaders' spawned workers below, which are fast).
WRITER_CONTEXTS = tiered(START_METHODS, {"fork"})
#: Loaders: fork (inherited descriptors) and spawn (descriptors pickled); forkserver as spawn.
CONTEXTS = tiered(START_METHODS, {"fork", "spawn"})
BIG = 200_000  # bytes: more than a pipe holds


def drain(q: DirectQueue, n: int) -> list[Any]:
    """``n`` messages; the first may wait for spawned writers to start (slow on a busy host)."""
    return [q.get(timeout=60 if i == 0 else 20) for i in range(n)]


def test_small_messages_need_no_feeder_thread() -> None:
    q = DirectQueue(multiprocessing.get_context("fork"))
    for i in range(50):
        q.put(("batch", i))
    assert q._feeder is None  # every one written by this thread
    assert drain(q, 50) == [("batch", i) for i in range(50)]
    q.close()


def test_a_full_pipe_never_blocks_and_order_is_kept() -> None:
    q = DirectQueue(multiprocessing.get_context("fork"))
    sent: list[Any] = []
    start = time.monotonic()
    for i in range(30):  # far more than the pipe holds, and nobody reads yet
        message = ("big", i, b"x" * BIG) if i % 3 == 0 else ("small", i)
        q.put(message)
        sent.append(message)
    assert time.monotonic() - start < 5
    assert q._feeder is not None  # what did not fit went to the feeder ...
    assert drain(q, 30) == sent  # ... and nothing overtook it
    q.close()
    q.join_thread()


def test_small_messages_past_a_full_pipe_go_to_the_feeder_in_order() -> None:
    q = DirectQueue(multiprocessing.get_context("fork"))
    start = time.monotonic()
    for i in range(5000):  # ~100 KiB of small messages: more than the pipe holds
        q.put(("small", i, "x" * 10))
    assert time.monotonic() - start < 5
    assert q._feeder is not None
    assert [m[1] for m in drain(q, 5000)] == list(range(5000))
    q.close()


class _SlowRelease:
    """The queue's write lock, released 0.2 s late (a feeder waiting for the GIL after a write)."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock

    def acquire(self, *args: Any) -> bool:
        return bool(self.lock.acquire(*args))

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.2)
        self.release()


def _last_words(q: DirectQueue, release: Any) -> None:
    q._wlock = _SlowRelease(q._wlock)
    q.put("first")
    release.wait(10)
    q.put("last")  # the writer exits right after: close() waits for the feeder to write it
    q.close()


def test_a_writer_that_exits_leaves_the_queue_usable() -> None:
    """A process exiting right after a put never leaves the write lock taken."""
    ctx = multiprocessing.get_context("fork")
    q = DirectQueue(ctx)
    for _ in range(3):
        release = ctx.Event()
        q._wlock.acquire()  # busy: the child's puts go to its feeder
        child = ctx.Process(target=_last_words, args=(q, release))
        child.start()
        time.sleep(0.3)  # longer than a put waits for the lock
        q._wlock.release()
        release.set()
        assert drain(q, 2) == ["first", "last"]
        child.join(10)
        assert child.exitcode == 0
        q.put("still writable")
        assert q.get(timeout=2) == "still writable"


def test_get_times_out_with_empty() -> None:
    q = DirectQueue(multiprocessing.get_context("fork"))
    with pytest.raises(queue.Empty):
        q.get(timeout=0.05)
    with pytest.raises(queue.Empty):
        q.get_nowait()
    assert q.empty()
    q.put_nowait(1)
    assert q.get(block=False) == 1


def _writer(q: DirectQueue, who: int, n: int) -> None:
    for i in range(n):
        q.put((who, i, bytes([who]) * (5000 if i % 7 else BIG)))
    q.close()
    q.join_thread()


@pytest.mark.parametrize("method", WRITER_CONTEXTS)
def test_writers_in_other_processes(method: str) -> None:
    """Messages of several processes arrive whole, each process's in its order."""
    ctx = multiprocessing.get_context(method)
    q = DirectContext(ctx).Queue()
    procs = [ctx.Process(target=_writer, args=(q, who, 40)) for who in (1, 2, 3)]
    for p in procs:
        p.start()
    got = drain(q, 120)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    for who in (1, 2, 3):
        mine = [m for m in got if m[0] == who]
        assert [m[1] for m in mine] == list(range(40))
        assert all(m[2] == bytes([who]) * len(m[2]) for m in mine)


def test_threads_of_one_process_share_it() -> None:
    q = DirectQueue(multiprocessing.get_context("fork"))

    def put(who: int) -> None:
        for i in range(200):
            q.put((who, i))

    threads = [threading.Thread(target=put, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = drain(q, 800)
    for w in range(4):
        assert [i for who, i in got if who == w] == list(range(200))


def test_the_context_keeps_everything_else() -> None:
    base = multiprocessing.get_context("spawn")
    ctx = DirectContext(base)
    assert ctx.get_start_method() == "spawn"
    assert ctx.Process is base.Process
    with pytest.raises(ValueError, match="maxsize"):
        ctx.Queue(3)
    assert type(DirectContext(torch.multiprocessing).Queue()).__name__ == "DirectQueue"


def test_closed_queue_refuses_puts() -> None:
    q = DirectQueue(multiprocessing.get_context("fork"))
    q.close()
    with pytest.raises(ValueError, match="closed"):
        q.put(1)
    q.cancel_join_thread()


class _PutsWhenCollected:
    """Like torch's iterator: in a cycle with its queue, and its ``__del__`` puts on it."""

    def __init__(self, q: DirectQueue) -> None:
        self.q = q
        self.me = self

    def __del__(self) -> None:
        try:
            self.q.put(None)
        except BaseException as error:  # pragma: no cover - the assertion reports it
            _COLLECTED_ERRORS.append(error)


_COLLECTED_ERRORS: list[BaseException] = []


# each round reproduces the collector's order (finalizer first); 20 rounds in the slow tier
@pytest.mark.parametrize("rounds", tiered([3, 20], {3}))
def test_a_put_from_a_del_in_the_queues_cycle_never_writes_to_a_closed_descriptor(
    rounds: int,
) -> None:
    # The collector runs the queue's weakref finalizer (closing its descriptor) before the
    # __del__ of an object in the same cycle: that put must not write to the closed number,
    # which the kernel may already have given to another file.
    _COLLECTED_ERRORS.clear()
    for _ in range(rounds):
        q = DirectQueue(multiprocessing.get_context("fork"))
        q.put("open the descriptor")
        assert q.get(timeout=5) == "open the descriptor"
        _PutsWhenCollected(q)
        del q
        gc.collect()
    assert _COLLECTED_ERRORS == []


@pytest.mark.parametrize("method", CONTEXTS)
def test_slot_loaders_use_it_and_torchs_path_does_not(method: str) -> None:
    data = torch.arange(64.0).view(32, 2)
    loader = create_dataloader(data, batch_size=4, num_workers=2, multiprocessing_context=method)
    it = iter(loader)
    assert isinstance(it._worker_result_queue, DirectQueue)  # type: ignore[attr-defined]
    assert all(isinstance(q, DirectQueue) for q in it._index_queues)  # type: ignore[attr-defined]
    assert torch.equal(torch.cat([next(it), *it]), data)
    assert loader.multiprocessing_context.get_start_method() == method  # the user's, as given
    loader.close()
    darwin = create_dataloader(
        data, batch_size=4, num_workers=2, platform=fake_platform(os_name="Darwin")
    )
    it = iter(darwin)
    assert not isinstance(it._worker_result_queue, DirectQueue)  # type: ignore[attr-defined]
    assert torch.equal(torch.cat(list(it)), data)
    darwin.close()
