"""loaderkit: PyTorch data loading that is correct by default.

Replace ``DataLoader(...)`` with ``create_dataloader`` (or import ``DataLoader`` from
here): every torch argument keeps its meaning, unset ones get safe and fast values, and each
decision is recorded in ``loader.plan``.
"""

from loaderkit.collate import Padded, pad_collate
from loaderkit.errors import (
    ArgumentTypeError,
    ConfigError,
    HDF5FileError,
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
from loaderkit.loader import DataLoader
from loaderkit.plan import Plan, PlanEntry
from loaderkit.platform import PlatformInfo, detect_platform
from loaderkit.policy import recommended_num_workers
from loaderkit.prefetch import DevicePrefetcher
from loaderkit.resources import LeakCheck
from loaderkit.seeding import (
    DeterminismReport,
    check_determinism,
    make_generator,
    seed_everything,
    seed_worker,
    worker_rng,
)
from loaderkit.sequence import SharedSequence
from loaderkit.storage import CacheStats, SessionCache
from loaderkit.transfer import to_device

__version__ = "0.1.0"

__all__ = [
    "ArgumentTypeError",
    "BlockShuffleSampler",
    "CacheStats",
    "ConfigError",
    "DataLoader",
    "DeterminismReport",
    "DevicePrefetcher",
    "HDF5FileError",
    "HDF5SessionDataset",
    "LeakCheck",
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
    "SharedSequence",
    "StorageAccessError",
    "StorageError",
    "__version__",
    "check_determinism",
    "create_dataloader",
    "detect_platform",
    "make_generator",
    "pad_collate",
    "recommended_num_workers",
    "seed_everything",
    "seed_worker",
    "to_device",
    "worker_rng",
]
