"""URL detection, glob expansion, the missing extra, and ``import loaderkit`` staying light."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from loaderkit.storage import expand, is_url, local_path
from tests.storage.conftest import Bucket

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("name", "url"),
    [
        ("s3://bucket/key.h5", True),
        ("gs://bucket/key.h5", True),
        ("https://host/key.h5", True),
        ("simplecache::s3://bucket/key.h5", True),
        ("/data/s1.h5", False),
        ("data/s1.h5", False),
        ("C:/data/s1.h5", False),
        ("C:\\data\\s1.h5", False),
        ("file:///data/s1.h5", False),
        (Path("/data/s1.h5"), False),
        (3, False),
    ],
)
def test_is_url(name: object, url: bool) -> None:
    assert is_url(name) is url


def test_local_path_strips_file_urls() -> None:
    assert local_path("file:///data/s1.h5") == "/data/s1.h5"
    assert local_path(Path("/data/s1.h5")) == "/data/s1.h5"


def test_expand_lists_each_glob_once_and_sorts(bucket: Bucket) -> None:
    for name in ("s3.h5", "s1.h5", "s2.h5", "other.txt"):
        bucket.put(f"p/{name}", b"x")
    bucket.server.requests.clear()
    files = ["/local/a.h5", bucket.url("p/s*.h5"), bucket.url("p/other.txt")]
    assert expand(files, bucket.options) == [
        "/local/a.h5",
        bucket.url("p/s1.h5"),
        bucket.url("p/s2.h5"),
        bucket.url("p/s3.h5"),
        bucket.url("p/other.txt"),
    ]
    assert len(bucket.server.listings()) == 1
    assert not [r for r in bucket.server.log() if r.path.endswith(".h5")]  # nothing read


def test_a_glob_matching_nothing_names_the_pattern(bucket: Bucket) -> None:
    pattern = bucket.url("p/nothing*.h5")
    with pytest.raises(FileNotFoundError, match=r"p/nothing\*\.h5"):
        expand([pattern], bucket.options)


def _run(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_loaderkit_imports_no_fsspec_and_a_url_without_the_extra_names_it() -> None:
    # one fresh interpreter (importing torch costs seconds): first what importing loaderkit
    # loads, then s3fs hidden, then fsspec hidden
    code = (
        "import sys, loaderkit, loaderkit.storage\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('fsspec', 's3fs', 'filelock', 'aiobotocore', 'botocore', 'aiohttp')))\n"
        "from loaderkit.errors import ConfigError\n"
        "from loaderkit.storage import filesystems, stat_objects\n"
        "for hidden in ('s3fs', 'fsspec'):\n"
        "    sys.modules[hidden] = None\n"
        "    filesystems.reset()\n"
        "    try:\n"
        "        stat_objects(['s3://bucket/key.h5'])\n"
        "    except ConfigError as exc:\n"
        "        print(hidden, '|', exc)\n"
    )
    lines = _run(code).splitlines()
    assert lines[0] == "[]"
    assert [line.split(" | ")[0] for line in lines[1:]] == ["s3fs", "fsspec"]
    for line in lines[1:]:
        assert 'pip install "loaderkit[remote]"' in line and "s3://bucket/key.h5" in line
