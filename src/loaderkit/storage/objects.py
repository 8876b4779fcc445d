"""What the store holds: the objects a glob names; each one's size, ETag, modification time.

Runs in the main process (dataset construction, ``loaderkit fetch``): ``expand`` lists the
store once per glob and returns plain URLs, sorted, so that workers never glob;
``stat_objects`` lists each distinct parent prefix once (``fs.ls(parent, detail=True)``)
instead of one HEAD per object; http(s), which has no listing, is asked per object
(``fs.info``). ``ObjectInfo`` is small, frozen and picklable: the dataset hands it to workers,
and the cache keys its entries by its ``identity``.
"""

from __future__ import annotations

import datetime
import email.utils
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from loaderkit.errors import StorageAccessError
from loaderkit.storage.filesystems import filesystem_for, protocol_of, strip
from loaderkit.storage.urls import has_glob, is_url

__all__ = ["ObjectInfo", "access_error", "expand", "refused", "stat_objects"]

_BUCKET_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "r2"})
_NO_LISTING = frozenset({"http", "https"})
#: Where listings give the modification time: s3fs, local/others, gcsfs, and fsspec's http
#: filesystem (the ``Last-Modified`` header, an RFC 9110 date).
_MTIME_FIELDS = ("LastModified", "mtime", "last_modified", "updated", "Last-Modified")


@dataclass(frozen=True)
class ObjectInfo:
    """One object as the store describes it.

    Attributes:
        url: The object's URL.
        size: Its size in bytes.
        etag: The store's ETag without quotes (``None`` where the store gives none).
        mtime: Its modification time (seconds since the epoch), if the store gives one.

    Examples:
        >>> info = ObjectInfo("s3://b/s1.h5", 1024, "9e1b3c...", None)
        >>> info.identity
        'size=1024;etag=9e1b3c...'
    """

    url: str
    size: int
    etag: str | None = None
    mtime: float | None = None

    @property
    def identity(self) -> str:
        """The object's version as text: size and ETag, or size and mtime without an ETag."""
        if self.etag:
            return f"size={self.size};etag={self.etag}"
        return f"size={self.size};mtime={self.mtime!r}"

    @property
    def md5(self) -> str | None:
        """The MD5 digest the ETag is, when it is one (32 hex digits; a multipart one has '-')."""
        etag = (self.etag or "").lower()
        if len(etag) == 32 and all(c in "0123456789abcdef" for c in etag):
            return etag
        return None


def stat_objects(
    urls: Iterable[str], storage_options: Mapping[str, Any] | None = None
) -> dict[str, ObjectInfo]:
    """Size, ETag and mtime of each URL: one listing call per distinct parent prefix.

    Local paths (``file://`` or plain, for a cache in front of a shared filesystem) are
    ``os.stat``-ed instead: size and modification time, no ETag.

    Args:
        urls: Object URLs (no globs: ``expand`` them first) or local paths.
        storage_options: Keyword arguments for the fsspec filesystem, passed unchanged.

    Returns:
        ``{url: ObjectInfo}`` in the order of ``urls``.

    Raises:
        FileNotFoundError: An object (the message names its URL) or its bucket (named with
            the URL) does not exist.
        StorageAccessError: The store refused the credentials (a ``PermissionError``).

    Examples:
        >>> stat_objects(["s3://bucket/s1.h5"], {"anon": True})  # doctest: +SKIP
        {'s3://bucket/s1.h5': ObjectInfo(url='s3://bucket/s1.h5', size=..., ...)}
    """
    wanted = list(dict.fromkeys(urls))
    groups: dict[tuple[str, str], list[str]] = {}
    found: dict[str, ObjectInfo] = {}
    for url in wanted:
        if protocol_of(url) == "file":  # a local (shared filesystem) path: one stat each
            found[url] = _local_info(url)
            continue
        fs = filesystem_for(url, storage_options)
        parent = strip(fs, url).rstrip("/").rsplit("/", 1)[0]
        groups.setdefault((protocol_of(url), parent), []).append(url)
    for (protocol, parent), members in groups.items():
        fs = filesystem_for(members[0], storage_options)
        if protocol.split("::")[-1] in _NO_LISTING:
            for url in members:
                found[url] = _info(url, _call(fs.info, strip(fs, url), url, fs, protocol))
            continue
        fs.invalidate_cache(parent)
        listing = _call(partial(fs.ls, detail=True), parent, members[0], fs, protocol)
        by_name = {str(entry["name"]).rstrip("/"): entry for entry in listing}
        for url in members:
            entry = by_name.get(strip(fs, url).rstrip("/"))
            if entry is None or entry.get("type") == "directory":
                raise FileNotFoundError(f"{url}: no such object in the store")
            found[url] = _info(url, entry)
    return {url: found[url] for url in wanted}


def expand(files: Sequence[str], storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """``files`` with every remote glob replaced by the URLs it matches, sorted.

    Local paths and URLs without glob characters are kept as they are and where they are;
    each glob is listed once (fsspec's ``glob``) and its matches sorted in its place.

    Args:
        files: Session files as the caller gave them (paths, URLs, URL globs).
        storage_options: Keyword arguments for the fsspec filesystem, passed unchanged.

    Returns:
        The names, globs expanded.

    Raises:
        FileNotFoundError: A glob matched nothing (the message names the pattern).
        ConfigError: A URL needs the ``remote`` extra, or an fsspec backend (s3fs...) that is
            not installed.

    Examples:
        >>> expand(["/data/s1.h5", "s3://bucket/s*.h5"], {"anon": True})  # doctest: +SKIP
        ['/data/s1.h5', 's3://bucket/s1.h5', 's3://bucket/s2.h5']
    """
    out: list[str] = []
    for name in files:
        text = os.fspath(name)
        if not (is_url(text) and has_glob(text)):
            out.append(text)
            continue
        fs = filesystem_for(text, storage_options)
        matches = sorted(fs.glob(strip(fs, text)))
        if not matches:
            raise FileNotFoundError(
                f"the pattern {text!r} matched no object: check the bucket, the prefix and "
                "the credentials (storage_options)"
            )
        out.extend(_unstrip(text, match) for match in matches)
    return out


def _unstrip(pattern: str, path: str) -> str:
    """``path`` (as fsspec lists it) as a URL with the pattern's protocol (and chain)."""
    prefix = pattern.split("://", 1)[0]
    return f"{prefix}://{path.split('://', 1)[-1] if '://' in path else path}"


def access_error(url: str, cause: BaseException) -> StorageAccessError:
    """The ``StorageAccessError`` for a refused request on ``url``, naming what to do.

    Examples:
        >>> print(access_error("s3://b/s1.h5", PermissionError("Forbidden")))
        s3://b/s1.h5: the store refused access (Forbidden). For a public bucket pass ...
    """
    return StorageAccessError(
        f"{url}: the store refused access ({cause}). For a public bucket pass "
        'storage_options={"anon": True}; for a private one give credentials (the environment '
        "variables or config file of the store's client, or storage_options such as "
        '{"key": ..., "secret": ...} or {"profile": ...})'
    )


def refused(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) is an HTTP 401/403 refusal.

    fsspec's http filesystem reports every failed ``info`` as ``FileNotFoundError``, raised from
    aiohttp's error, which carries the status.

    Examples:
        >>> refused(PermissionError("Forbidden")), refused(FileNotFoundError("x"))
        (True, False)
    """
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, PermissionError) or getattr(seen, "status", None) in (401, 403):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _call(function: Any, path: str, url: str, fs: Any, protocol: str) -> Any:
    """``function(path)`` with fsspec's errors turned into ones that name the URL and the fix."""
    try:
        return function(path)
    except PermissionError as exc:
        raise access_error(url, exc) from exc
    except FileNotFoundError as exc:
        if refused(exc):
            raise access_error(url, exc) from exc
        bucket = strip(fs, url).lstrip("/").split("/", 1)[0]
        if protocol.split("::")[-1] in _BUCKET_STORES and not _bucket_exists(fs, bucket):
            raise FileNotFoundError(
                f"{url}: the bucket {bucket!r} does not exist (check its name and the endpoint)"
            ) from exc
        raise FileNotFoundError(f"{url}: no such object in the store") from exc


def _bucket_exists(fs: Any, bucket: str) -> bool:
    try:
        fs.invalidate_cache(bucket)
        fs.ls(bucket, detail=False)
    except FileNotFoundError:
        return False
    except Exception:  # refused or anything else: not evidence that it is missing
        return True
    return True


def _local_info(name: str) -> ObjectInfo:
    path = name[len("file://") :] if name.lower().startswith("file://") else name
    try:
        st = os.stat(path)
    except FileNotFoundError as exc:
        raise FileNotFoundError(exc.errno, f"{name}: no such file", path) from exc
    except PermissionError as exc:
        raise access_error(name, exc) from exc
    return ObjectInfo(name, st.st_size, None, st.st_mtime_ns / 1e9)


def _info(url: str, entry: Mapping[str, Any]) -> ObjectInfo:
    size = entry.get("size", entry.get("Size"))
    if size is None:
        raise FileNotFoundError(f"{url}: the store did not report a size for this object")
    etag = next((entry[k] for k in ("ETag", "etag", "e_tag") if entry.get(k)), None)
    mtime = next(
        (entry[k] for k in _MTIME_FIELDS if entry.get(k)),
        None,
    )
    return ObjectInfo(
        url, int(size), str(etag).strip('"') if etag is not None else None, _seconds(mtime)
    )


def _seconds(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime.datetime):
        return value.timestamp()
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        pass
    try:  # an HTTP date: "Wed, 25 Nov 2026 02:14:35 GMT"
        return email.utils.parsedate_to_datetime(str(value)).timestamp()
    except (TypeError, ValueError):
        return None
