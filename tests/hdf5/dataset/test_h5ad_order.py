"""``.h5ad`` datasets in the loader's order machinery, as dense sessions are (tests/order/).

Three files of CSR cells whose column 0 names the cell (``1000 * file + row + 1``); a sample
is ``[cell, u]``, ``u`` drawn from ``worker_rng()`` while the sample is made (``sample_seeding``),
so equal samples mean equal seeded draws too. Elastic ranks are a real gloo group (forked):
the global batches of 2 ranks equal one process's, every cell once per epoch, and rank 0's
mid-epoch state resumes on one process; a mid-epoch state resumes exactly on another number of
workers (0, 2 forked, threads).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from loaderkit import DataLoader, worker_rng
from loaderkit.hdf5 import HDF5SessionDataset
from tests.dist_utils import run_distributed

pytest.importorskip("anndata")
pytest.importorskip("scipy.sparse")

from tests.hdf5.h5adfiles import matrix, write_current, write_legacy

FILES, CELLS = 3, 40  # 120 cells
GLOBAL, SEED, STOP, EPOCHS = 8, 11, 4, 2
Batches = list[list[tuple[int, float]]]


class DrawCells(HDF5SessionDataset):
    """A cell's sample is ``[its name (column 0), u]``, ``u`` from ``worker_rng()``.

    (The worker's own generator: in worker threads torch's default one is shared.)
    """

    def transform(self, sample: Any, index: int) -> Any:
        return np.array([float(sample[0]), worker_rng().random()])


def write_files(root: Path) -> list[str]:
    """Anndata's encoding uncompressed and gzip, and the legacy one (column 0 names a cell)."""
    paths = []
    for f in range(FILES):
        m = matrix(f, cells=CELLS).tolil()
        m[:, 0] = (1000 * f + np.arange(CELLS) + 1).reshape(-1, 1)
        m = m.tocsr()
        path = root / f"cells{f}.h5ad"
        if f == 2:
            write_legacy(path, m)
        else:
            write_current(path, m, **({"compression": "gzip"} if f == 1 else {}))
        paths.append(str(path))
    return paths


def make(paths: list[str], kind: str, world: int, **kwargs: Any) -> DataLoader:
    dataset = DrawCells(paths, key="X", sparse="dense", max_open_files=2)
    return DataLoader(
        dataset,
        batch_size=GLOBAL // world,
        shuffle="block" if kind == "block" else True,
        seed=SEED,
        training=True,
        sample_seeding=True,
        **kwargs,
    )


def samples(batch: Any) -> list[tuple[int, float]]:
    return [(int(cell), float(u)) for cell, u in torch.as_tensor(batch).tolist()]


def passes(loader: DataLoader, count: int) -> list[Batches]:
    return [[samples(b) for b in loader] for _ in range(count)]


def interrupted(loader: DataLoader) -> tuple[Batches, dict[str, Any]]:
    iterator = iter(loader)
    seen = [samples(next(iterator)) for _ in range(STOP)]
    state = loader.state_dict()
    del iterator
    return seen, state


def _rank(rank: int, world: int, paths: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("shuffle", "block"):
        with make(paths, kind, world, num_workers=1) as loader:
            out[f"{kind}:batches"] = passes(loader, EPOCHS)
        with make(paths, kind, world) as loader:
            out[f"{kind}:state"] = interrupted(loader)[1]
    return out


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_files(tmp_path_factory.mktemp("h5ad-order"))


@pytest.fixture(scope="module")
def reference(paths: list[str]) -> dict[str, list[Batches]]:
    """Two epochs on one process, no workers, per kind of shuffle."""
    out = {}
    for kind in ("shuffle", "block"):
        with make(paths, kind, 1) as loader:
            out[kind] = passes(loader, EPOCHS)
    return out


def _cells(paths: list[str]) -> list[int]:
    return sorted(1000 * f + r + 1 for f in range(len(paths)) for r in range(CELLS))


@pytest.mark.distributed
def test_two_gloo_ranks_read_one_process_global_batches_and_resume_on_one(
    paths: list[str], reference: dict[str, list[Batches]], tmp_path: Path
) -> None:
    ranks = run_distributed(_rank, 2, tmp_path, paths)
    for kind in ("shuffle", "block"):
        want = reference[kind]
        for epoch in want:  # every cell once per epoch, a new order each epoch
            assert sorted(cell for batch in epoch for cell, _ in batch) == _cells(paths)
        assert want[0] != want[1]
        merged = [
            [[s for r in ranks for s in r[f"{kind}:batches"][e][k]] for k in range(len(want[e]))]
            for e in range(EPOCHS)
        ]
        assert merged == want, kind
        state = ranks[0][f"{kind}:state"]
        assert (state["epoch"], state["batches_yielded"]) == (0, STOP)
        with make(paths, kind, 1, num_workers=2, multiprocessing_context="fork") as loader:
            loader.load_state_dict(state)
            assert passes(loader, EPOCHS) == [want[0][STOP:], want[1]], kind


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ({"num_workers": 2, "multiprocessing_context": "fork"}, {}),
        ({}, {"num_workers": 3, "multiprocessing_context": "fork"}),
        ({"num_workers": 2, "worker_method": "thread"}, {"num_workers": 1}),
    ],
    ids=["2-fork-to-0", "0-to-3-fork", "2-threads-to-1"],
)
def test_a_mid_epoch_state_resumes_on_another_number_of_workers(
    paths: list[str],
    reference: dict[str, list[Batches]],
    before: dict[str, Any],
    after: dict[str, Any],
) -> None:
    want = reference["block"]
    with make(paths, "block", 1, **before) as loader:
        seen, state = interrupted(loader)
    with make(paths, "block", 1, **after) as loader:
        loader.load_state_dict(state)
        rest = passes(loader, EPOCHS)
    assert seen == want[0][:STOP]
    assert rest == [want[0][STOP:], want[1]]
    cells = [cell for batch in seen + rest[0] for cell, _ in batch]
    assert sorted(cells) == _cells(paths)  # every cell exactly once across the interruption
