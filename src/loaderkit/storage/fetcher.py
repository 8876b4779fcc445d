"""Fetching ahead: background threads that lease the next sessions of the loader's order.

``Prefetcher`` runs in the process that reads (a DataLoader worker, or the main process with
``num_workers=0``). Its threads start on the first ``ahead()`` call in that process, never at
construction, so a forked child starts none until it asks; a pickled ``Prefetcher`` (spawn)
carries only its configuration. The threads call ``SessionCache.lease`` in the order given, at
most ``threads`` at a time, and hold each lease while the URL is in the window, so the entries
the reader needs next are never evicted. ``fetch_many`` warms a cache before a job (the CLI).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from loaderkit.errors import ConfigError
from loaderkit.storage.cache import SessionCache, Transform
from loaderkit.storage.download import Cancelled
from loaderkit.storage.objects import ObjectInfo
from loaderkit.storage.records import CachedFile

__all__ = ["Prefetcher", "fetch_many"]

logger = logging.getLogger(__name__)


class Prefetcher:
    """Keeps the next ``window`` sessions of an order fetched and leased, in background threads.

    Args:
        cache: The node's cache.
        infos: ``{url: ObjectInfo}`` for every URL that ``ahead`` may name.
        storage_options: Keyword arguments for the fsspec filesystem.
        window: Sessions held ahead; default ``cache.prefetch``.
        threads: Downloads at once (1 to 8).
        transform: Passed to ``SessionCache.lease`` (the ``rows`` layout).

    Examples:
        >>> fetcher = Prefetcher(cache, infos, {"anon": True})  # doctest: +SKIP
        >>> fetcher.ahead(urls[3:])  # the reader is about to read urls[3]  # doctest: +SKIP
        >>> fetcher.close()  # doctest: +SKIP
    """

    def __init__(
        self,
        cache: SessionCache,
        infos: Mapping[str, ObjectInfo],
        storage_options: Mapping[str, Any] | None = None,
        *,
        window: int | None = None,
        threads: int = 2,
        transform: Transform | None = None,
    ) -> None:
        if not 1 <= threads <= 8:
            raise ConfigError(f"threads must be an int in [1, 8], got {threads!r}")
        self.cache = cache
        self.infos = dict(infos)
        self.storage_options = dict(storage_options or {})
        self.window = cache.prefetch if window is None else int(window)
        self.threads = threads
        self.transform = transform
        self._start_fresh()

    def _start_fresh(self) -> None:
        """Fresh per-process state (a new process forgets its parent's threads and leases)."""
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._cancel = threading.Event()
        self._threads: list[threading.Thread] = []
        self._queue: list[str] = []
        self._wanted: list[str] = []
        self._held: dict[str, CachedFile] = {}
        self._in_flight: set[str] = set()
        self._errors: dict[str, BaseException] = {}
        self._waiting = 0  # callers in wait()
        self._closed = False

    def __getstate__(self) -> dict[str, Any]:
        keep = ("cache", "infos", "storage_options", "window", "threads", "transform")
        return {name: self.__dict__[name] for name in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start_fresh()

    def _here(self) -> None:
        if self._pid != os.getpid():
            self._start_fresh()  # a forked child: the parent's threads do not exist here

    def ahead(self, upcoming: Iterable[str]) -> None:
        """Move the window to the first ``window`` URLs of ``upcoming`` (the order from now on).

        URLs that left the window are released (a download in flight finishes, then is
        released); new ones already complete in the cache are leased here, in the caller's
        thread (a warm pass wakes no thread), the others queued in order.

        Raises:
            KeyError: A URL that ``infos`` does not describe.
        """
        self._here()
        window: list[str] = []
        for url in upcoming:
            if len(window) >= self.window:
                break
            if url not in window:
                if url not in self.infos:
                    raise KeyError(f"{url}: not among the Prefetcher's infos")
                window.append(url)
        with self._cond:
            if self._closed:
                return
            self._wanted = window
            for url in [url for url in self._held if url not in window]:
                self._held.pop(url).close()
            self._queue = []
            for url in window:
                if url in self._held or url in self._in_flight or url in self._errors:
                    continue
                cached = self._lease_cached(url)
                if cached is not None:
                    self._held[url] = cached  # warm: no thread woken, nothing to download
                else:
                    self._queue.append(url)
            while len(self._threads) < min(self.threads, len(self._queue) + len(self._in_flight)):
                worker = threading.Thread(
                    target=self._run, name=f"loaderkit-prefetch-{len(self._threads)}", daemon=True
                )
                self._threads.append(worker)
                worker.start()
            if self._queue or self._waiting:
                self._cond.notify_all()

    def _lease_cached(self, url: str) -> CachedFile | None:
        """``url``'s entry leased now if the cache holds it (``None``: a thread fetches it)."""
        try:
            return self.cache.lease_cached(self.infos[url])
        except OSError:  # the thread's lease reports it (named) where it is needed
            logger.debug("leasing %s from the cache failed; queued", url, exc_info=True)
            return None

    def held(self) -> list[str]:
        """The URLs whose leases the prefetcher holds now, in window order."""
        self._here()
        with self._cond:
            return [url for url in self._wanted if url in self._held]

    def errors(self) -> dict[str, BaseException]:
        """Downloads that failed (the reader's own ``lease`` raises them again, named)."""
        with self._cond:
            return dict(self._errors)

    def wait(self, url: str, timeout: float | None = None) -> bool:
        """Wait until ``url`` is held (``True``), failed, or left the window (``False``)."""
        self._here()
        with self._cond:
            self._waiting += 1
            try:
                self._cond.wait_for(
                    lambda: (
                        self._closed
                        or url in self._held
                        or url in self._errors
                        or (url not in self._wanted)
                    ),
                    timeout,
                )
            finally:
                self._waiting -= 1
            return url in self._held

    def close(self, timeout: float = 5.0) -> None:
        """Stop: cancel downloads in flight (at their next block), release every lease.

        Returns within about ``timeout`` seconds; a thread still blocked in the store's client
        then is a daemon and ends with its download. Idempotent.
        """
        if self._pid != os.getpid():
            return
        with self._cond:
            self._closed = True
            self._cancel.set()
            self._queue.clear()
            held, self._held = list(self._held.values()), {}
            self._cond.notify_all()
        for lease in held:
            lease.close()
        for worker in self._threads:
            worker.join(timeout)

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or bool(self._queue))
                if self._closed:
                    return
                url = self._queue.pop(0)
                self._in_flight.add(url)
            lease: CachedFile | None = None
            error: BaseException | None = None
            try:
                lease = self.cache.lease(
                    self.infos[url],
                    self.storage_options,
                    transform=self.transform,
                    cancel=self._cancel,
                )
            except Cancelled:
                pass
            except Exception as exc:
                error = exc
                logger.debug("prefetching %s failed: %r", url, exc)
            with self._cond:
                self._in_flight.discard(url)
                if error is not None:
                    self._errors[url] = error
                if lease is not None:
                    if not self._closed and url in self._wanted:
                        self._held[url] = lease
                    else:
                        lease.close()
                self._cond.notify_all()


def fetch_many(
    cache: SessionCache,
    infos: Sequence[ObjectInfo],
    storage_options: Mapping[str, Any] | None = None,
    *,
    threads: int = 4,
    progress: Callable[[int], None] | None = None,
    transform: Transform | None = None,
) -> list[Path]:
    """Fetch every object into ``cache`` (a job's warm-up, ``loaderkit fetch``); their paths.

    Args:
        cache: The node's cache.
        infos: The objects (``stat_objects(expand(urls, options), options).values()``).
        storage_options: Keyword arguments for the fsspec filesystem.
        threads: Downloads at once.
        progress: Called with each downloaded block's byte count (``tqdm(...).update``);
            called from the download threads.
        transform: Passed to ``SessionCache.lease``.

    Returns:
        The local paths in the order of ``infos`` (released: they may be evicted later).

    Examples:
        >>> options = {"anon": True}
        >>> infos = stat_objects(expand(["s3://b/s*.h5"], options), options)  # doctest: +SKIP
        >>> fetch_many(cache, list(infos.values()), options)  # doctest: +SKIP
    """

    def one(info: ObjectInfo) -> Path:
        with cache.lease(info, storage_options, transform=transform, progress=progress) as got:
            return got.path

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        return list(pool.map(one, infos))
