"""Natural Scenes Dataset (NSD) betas, as NSD stores them, with loaderkit's HDF5SessionDataset.

NSD stores single-trial betas per subject in one file per scan session
(``.../betas_fithrf_GLMdenoise_RR/betas_session01.hdf5`` ... ``betas_session40.hdf5``). Each
holds ``betas``, written from MATLAB with ``h5create(file, '/betas', size(betas), 'Datatype',
'int16', 'ChunkSize', [1 1 1 750])``: h5py sees ``(750, Z, Y, X)`` (volumes) or ``(750, V)``
(surfaces), int16 betas x 300 (divide by 300 for percent signal change), chunks ``(750, 1, ...)``:
**each chunk is one voxel's 750 trials, so one trial touches every chunk** (a whole 1 GB file
for the 1.8 mm volume). The image shown on every trial comes from the experiment design
(``nsd_expdesign.mat``: ``masterordering`` and ``subjectim``), 30,000 trials per subject.

What to pass (docs/hdf5.md, "NSD betas"):

* ``shuffle="block"``: each worker reads a session once per pass (every chunk once) and serves
  its trials from memory, within ``max_session_bytes`` (fitted to the machine; the loader's
  plan says how many sessions fit);
* or rewrite the files once with ``loaderkit rechunk --key betas --out DIR FILE...``: a trial
  is then one read of its own bytes, and any order is fast.

``NSDBetas`` indexes any subset of global trials and returns ``{"betas", "stimulus", "trial"}``
per sample; its ``read`` calls the base ``read`` through ``super()`` and converts the row to
float32. Point it at the real data with::

    ds = NSDBetas.from_directory(
        "/data/nsd/nsddata_betas/ppdata/subj01/func1pt8mm/betas_fithrf_GLMdenoise_RR",
        stimulus=image_ids,  # 30,000 ints: subjectim[subj - 1, masterordering - 1] - 1
        h5py_options={"locking": False},  # read-only network file systems
    )
    loader = loaderkit.DataLoader(ds, batch_size=64, shuffle="block", num_workers=8, seed=0)

``python examples/nsd_dataset.py`` writes a small dataset with NSD's layout in a temporary
directory, reads it through a multi-worker loader in block order and checks every sample.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

import loaderkit
from loaderkit.hdf5 import HDF5SessionDataset, SampleIndex

__all__ = ["NSDBetas", "main", "make_fake_nsd"]

TRIALS_PER_SESSION = 750
BETA_SCALE = np.float32(300)
_SESSION_FILE = re.compile(r"betas_session(\d+)\.(?:hdf5|h5)$")


class NSDBetas(HDF5SessionDataset):
    """Single-trial NSD betas, one HDF5 file per session, as float32 percent signal change.

    Args:
        files: Session number (1-based, as in the file names) -> path of its betas file.
        stimulus: Image id (0-based index into the 73k NSD images) of every global trial,
            ``stimulus[t]`` for trial ``t = (session - 1) * trials_per_session + row``; or
            ``None`` to return -1.
        trials: Global trial numbers to include (default: every trial of every given
            session), e.g. only the trials of the shared 1,000 images.
        trials_per_session: 750 in NSD.
        **kwargs: For ``HDF5SessionDataset`` (``max_session_bytes``, ``max_open_files``,
            ``h5py_options``, ...).

    Example:
        >>> ds = NSDBetas({1: "betas_session01.hdf5"}, stimulus=ids)  # doctest: +SKIP
        >>> ds[0]["betas"].dtype
        dtype('float32')
    """

    def __init__(
        self,
        files: Mapping[int, str | os.PathLike[str]],
        *,
        stimulus: Sequence[int] | np.ndarray | None = None,
        trials: Sequence[int] | np.ndarray | None = None,
        trials_per_session: int = TRIALS_PER_SESSION,
        **kwargs: Any,
    ) -> None:
        # Attributes used by build_index() are set before the base class builds the index.
        self.trials_per_session = trials_per_session
        self.stimulus = None if stimulus is None else np.asarray(stimulus, dtype=np.int64)
        self.trials = None if trials is None else np.asarray(trials, dtype=np.int64)
        super().__init__(files, key="betas", **kwargs)

    @classmethod
    def from_directory(cls, root: str | os.PathLike[str], **kwargs: Any) -> NSDBetas:
        """Use every ``betas_sessionNN.hdf5`` in ``root`` (session numbers from the names)."""
        files = {}
        for path in sorted(Path(root).iterdir()):
            match = _SESSION_FILE.search(path.name)
            if match:
                files[int(match.group(1))] = path
        if not files:
            raise FileNotFoundError(f"no betas_sessionNN.hdf5 files in {root}")
        return cls(files, **kwargs)

    def global_trial(self, session: int, row: int) -> int:
        """Global trial number of ``row`` in ``session`` (1-based session)."""
        return (int(session) - 1) * self.trials_per_session + int(row)

    def build_index(self) -> SampleIndex:
        """The trial map: global trial -> (session, row), for the selected trials."""
        sessions = np.array(sorted(self.files), dtype=np.int64)
        rows_in_file = np.array(
            [0 if (lay := self.layout(s)) is None else lay.rows for s in sessions], np.int64
        )
        if self.trials is None:
            trials = np.concatenate(
                [
                    (s - 1) * self.trials_per_session + np.arange(n)
                    for s, n in zip(sessions, rows_in_file, strict=True)
                ]
            )
        else:
            trials = self.trials
        session_of = trials // self.trials_per_session + 1
        row_of = trials % self.trials_per_session
        known = dict(zip(sessions.tolist(), rows_in_file.tolist(), strict=True))
        missing = sorted({int(s) for s in session_of if int(s) not in known})
        if missing:
            raise FileNotFoundError(f"trials requested from sessions without a file: {missing}")
        too_far = [
            int(t) for t, s, r in zip(trials, session_of, row_of, strict=True) if r >= known[int(s)]
        ]
        if too_far:
            raise IndexError(f"trials beyond the rows stored in their session file: {too_far[:10]}")
        return SampleIndex(session_of, row_of)

    def read(self, session: Hashable, row: int) -> dict[str, Any]:
        """One trial: float32 betas (int16 / 300), its image id and its global trial number.

        The base ``read`` returns the stored int16 row; in block order it comes from the
        session held in memory (read once per pass, every chunk once).
        """
        betas = super().read(session, row).astype(np.float32) / BETA_SCALE
        trial = self.global_trial(int(session), row)  # type: ignore[call-overload]
        stimulus = -1 if self.stimulus is None else int(self.stimulus[trial])
        return {"betas": betas, "stimulus": stimulus, "trial": trial}


def make_fake_nsd(
    root: Path, *, sessions: int, trials: int, voxels: int, seed: int = 0
) -> tuple[dict[int, Path], np.ndarray, dict[int, np.ndarray]]:
    """Write session files in NSD's layout and a stimulus table.

    ``betas`` is ``(trials, voxels)`` int16 (betas x 300) with chunks ``(trials, 1)``: one chunk
    per voxel, as MATLAB's ``h5create(..., 'ChunkSize', [1 1 1 750])`` writes them.

    Returns ``(files, stimulus, raw)``: session -> path, image id per global trial, and the
    int16 arrays written (for checking).
    """
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    files, raw = {}, {}
    for s in range(1, sessions + 1):
        data = rng.integers(-3000, 3000, size=(trials, voxels), dtype=np.int16)
        path = root / f"betas_session{s:02d}.hdf5"
        with h5py.File(path, "w") as f:
            f.create_dataset("betas", data=data, chunks=(trials, 1))
        files[s], raw[s] = path, data
    stimulus = rng.integers(0, 73000, size=sessions * trials)
    return files, stimulus, raw


def main(argv: Sequence[str] | None = None) -> int:
    """Write a small dataset in NSD's layout, load it with workers and check every sample."""
    parser = argparse.ArgumentParser(description="NSD betas through HDF5SessionDataset")
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--trials", type=int, default=60, help="trials per session")
    parser.add_argument("--voxels", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        _, stimulus, raw = make_fake_nsd(
            Path(tmp), sessions=args.sessions, trials=args.trials, voxels=args.voxels
        )
        # Every other trial, e.g. a train split; the trial map handles any subset.
        selected = np.arange(0, args.sessions * args.trials, 2)
        with warnings.catch_warnings():
            # the layout is NSD's own: the hint's first remedy, block order, is used below
            warnings.simplefilter("ignore", loaderkit.PerformanceHint)
            ds = NSDBetas.from_directory(
                tmp, stimulus=stimulus, trials=selected, trials_per_session=args.trials
            )
        loader = loaderkit.DataLoader(
            ds,
            batch_size=args.batch_size,
            shuffle="block",
            num_workers=args.workers,
            seed=0,
        )
        held = loader.plan["max_session_bytes"]
        checked = 0
        for epoch in range(args.epochs):
            seen = []
            for batch in loader:
                for betas, stim, trial in zip(
                    batch["betas"], batch["stimulus"], batch["trial"], strict=True
                ):
                    t = int(trial)
                    session, row = divmod(t, args.trials)
                    want = raw[session + 1][row].astype(np.float32) / BETA_SCALE
                    if not torch.equal(betas, torch.from_numpy(want)) or int(stim) != stimulus[t]:
                        print(f"mismatch at trial {t}")
                        return 1
                    seen.append(t)
                    checked += 1
            if sorted(seen) != selected.tolist():
                print(f"epoch {epoch}: trials missing or repeated")
                return 1
        loader.close()
    print(
        f"checked {checked} samples over {args.epochs} epochs from {args.sessions} sessions "
        f"({len(ds)} trials, batch {args.batch_size}, {args.workers} workers); "
        f"max_session_bytes {held.value:,} ({held.reason})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
