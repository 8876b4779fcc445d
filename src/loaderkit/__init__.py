"""loaderkit: PyTorch data loading that is correct by default.

Replace ``DataLoader(...)`` with ``create_dataloader`` (or import ``DataLoader`` from
here): every torch argument keeps its meaning, unset ones get safe and fast values, and each
decision is recorded in ``loader.plan``.

The package root is the front door (this module, ``factory``, ``loader``, ``planning`` with
the checks before workers start in ``checks``, ``passes``), the leaves every layer may use
(``errors``, ``plan``), the finished-batch contract (``batches``: ``RowBatch``, and the
``BatchMemory`` a reading process writes batches in) and what a loader asks of a dataset
(``support``: ``LoaderSupport``); the rest lives in a folder per stage of the data's way,
lowest first: ``machine`` (what this machine and torch are), ``workers`` (what runs in worker
processes and threads, and the hand-off), ``memory`` (what processes hold), ``order`` (which
samples, in what order), ``policy`` (decisions and checks before a start), ``device`` (to the
GPU), ``singlecell`` (a batch of counts normalised), ``storage`` (where files live), ``hdf5``
(reading sessions); ``integrations`` and ``cli`` sit on top. ``_torch`` holds every use of
torch's private API. ``docs/architecture.md`` draws the flow.
"""

from loaderkit import singlecell as singlecell
from loaderkit.batches.contract import Padded
from loaderkit.device.prefetch import DevicePrefetcher
from loaderkit.device.transfer import to_device
from loaderkit.errors import (
    ArgumentTypeError,
    CacheDamageError,
    CacheRepairWarning,
    ConfigError,
    HDF5FileError,
    LoaderkitDeprecationWarning,
    LoaderkitError,
    LoaderkitWarning,
    MissingKeyError,
    PerformanceHint,
    RaggedBatchError,
    ResourceLeakError,
    StorageAccessError,
    StorageError,
)
from loaderkit.factory import create_dataloader
from loaderkit.hdf5 import BlockShuffleSampler, HDF5SessionDataset
from loaderkit.hdf5.anndata import balanced_weights
from loaderkit.loader import DataLoader
from loaderkit.machine.platform import PlatformInfo, detect_platform
from loaderkit.memory.leakcheck import LeakCheck
from loaderkit.memory.sequence import SharedSequence
from loaderkit.order.mixing import batch_mix, order_mix
from loaderkit.order.seeding import (
    DeterminismReport,
    check_determinism,
    make_generator,
    seed_everything,
    seed_worker,
    worker_rng,
)
from loaderkit.order.weighted import WeightedSampler
from loaderkit.plan import Plan, PlanEntry
from loaderkit.policy import recommended_num_workers
from loaderkit.storage import CacheStats, SessionCache
from loaderkit.support import LoaderSupport, SessionIndex
from loaderkit.workers.collate import pad_collate

__version__ = "0.2.0"

__all__ = [
    "ArgumentTypeError",
    "BlockShuffleSampler",
    "CacheDamageError",
    "CacheRepairWarning",
    "CacheStats",
    "ConfigError",
    "DataLoader",
    "DeterminismReport",
    "DevicePrefetcher",
    "HDF5FileError",
    "HDF5SessionDataset",
    "LeakCheck",
    "LoaderSupport",
    "LoaderkitDeprecationWarning",
    "LoaderkitError",
    "LoaderkitWarning",
    "MissingKeyError",
    "Padded",
    "PerformanceHint",
    "Plan",
    "PlanEntry",
    "PlatformInfo",
    "RaggedBatchError",
    "ResourceLeakError",
    "SessionCache",
    "SessionIndex",
    "SharedSequence",
    "StorageAccessError",
    "StorageError",
    "WeightedSampler",
    "__version__",
    "balanced_weights",
    "batch_mix",
    "check_determinism",
    "create_dataloader",
    "detect_platform",
    "make_generator",
    "order_mix",
    "pad_collate",
    "recommended_num_workers",
    "seed_everything",
    "seed_worker",
    "to_device",
    "worker_rng",
]
