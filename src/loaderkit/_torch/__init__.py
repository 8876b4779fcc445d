"""The one place loaderkit relies on torch's internals (torch 2.4 to 2.15).

Everything private of torch that loaderkit uses lives in this package, behind plain functions
and classes; the rest of loaderkit imports only what is exported here
(``tests/_torch/test_boundary.py`` scans the source to keep it so). It imports torch and
nothing of loaderkit outside this folder: every other layer sits above it. One module per
piece, each saying which torch releases it was checked on:

=================  =========================================================================
``loader``         ``TorchLoader`` (torch's DataLoader with ``_get_iterator`` and
                   ``_index_sampler`` as loaderkit hooks), the kept iterator, ``LoaderView``,
                   the arguments each torch accepts
``iterators``      the pass iterators (torch's iterator classes calling ``PassHooks``), their
                   workers and queues as ``IteratorParts``, torch's own iterator as a fallback
``collate``        ``default_collate``'s tensor rule, torch's pinning, ``ExceptionWrapper``
``storage``        shared storages from a descriptor, their use count, shared allocation
``seeds``          the base-seed draw of a new iterator, how worker seeds derive from it
``messages``       the texts of torch's worker-death errors
``signals``        torch's ``SIGCHLD`` handler, wrapped
``cuda``           torch's bad-fork check
``devices``        the current accelerator (``torch.accelerator`` from 2.6, CUDA before)
``datapipes``      how torch sends DataPipes to workers
``threadloop``     worker threads: ``get_worker_info()`` per thread, ``WorkerInfo`` built with
                   this torch's fields, the fetcher, the pass iterator over threads
``probes``         one probe per piece, run once per process (``support()``)
``version``        torch's version, parsed, and the releases loaderkit is tested on
=================  =========================================================================

A gate, not a crash: nothing here touches a private name at import time in a way that can fail,
and where a probe fails the piece falls back to torch's public path; the loader warns once
(``LoaderkitWarning``, naming the torch version and what was turned off) and shows it in its
plan (row ``torch``). Model: Lightning's compat flags and ``lightning_utilities`` helpers, one
module answering every torch difference.

Examples:
    >>> from loaderkit import _torch
    >>> _torch.support().version == __import__("torch").__version__
    True
"""

from __future__ import annotations

from loaderkit._torch.collate import (
    NUMPY_BOOLS_COLLATE,
    default_collate,
    install_tensor_collate,
    is_exception_wrapper,
    pin_memory,
    tensor_rule,
)
from loaderkit._torch.cuda import in_bad_fork
from loaderkit._torch.datapipes import as_sent_to_workers
from loaderkit._torch.devices import accelerator_type, record_stream
from loaderkit._torch.iterators import (
    IteratorParts,
    PassHooks,
    hooks_of,
    make_iterator,
    mark_worker_gone,
    parts,
    shutdown_workers,
)
from loaderkit._torch.loader import (
    ARGUMENTS_SINCE,
    LoaderView,
    TorchLoader,
    forget_kept_iterator,
    index_sampler,
    kept_iterator,
    loader_parameters,
    torch_check_workers,
    torch_index_sampler,
)
from loaderkit._torch.messages import deaths_named, is_worker_exception, may_be_worker_death
from loaderkit._torch.probes import PIECES, Probe, TorchSupport, refresh, support
from loaderkit._torch.seeds import consume_base_seed_draw, draw_seed, worker_base_seed
from loaderkit._torch.signals import wrap_worker_signal_handler
from loaderkit._torch.storage import new_shared_tensor, storage_from_fd, storage_use_count
from loaderkit._torch.threadloop import (
    CarrierFactory,
    ThreadCarrier,
    ThreadSetup,
    create_fetcher,
    install_thread_info,
    make_thread_rng,
    make_worker_info,
    set_thread_info,
    thread_info_probe,
    thread_iterator,
    thread_safe_generator_exists,
)
from loaderkit._torch.version import (
    CHECKED_ON,
    TESTED_FROM,
    TESTED_TO,
    TORCH_VERSION,
    newer_than_tested,
    parse_version,
)

__all__ = [
    "ARGUMENTS_SINCE",
    "CHECKED_ON",
    "NUMPY_BOOLS_COLLATE",
    "PIECES",
    "TESTED_FROM",
    "TESTED_TO",
    "TORCH_VERSION",
    "CarrierFactory",
    "IteratorParts",
    "LoaderView",
    "PassHooks",
    "Probe",
    "ThreadCarrier",
    "ThreadSetup",
    "TorchLoader",
    "TorchSupport",
    "accelerator_type",
    "as_sent_to_workers",
    "consume_base_seed_draw",
    "create_fetcher",
    "deaths_named",
    "default_collate",
    "draw_seed",
    "forget_kept_iterator",
    "hooks_of",
    "in_bad_fork",
    "index_sampler",
    "install_tensor_collate",
    "install_thread_info",
    "is_exception_wrapper",
    "is_worker_exception",
    "kept_iterator",
    "loader_parameters",
    "make_iterator",
    "make_thread_rng",
    "make_worker_info",
    "mark_worker_gone",
    "may_be_worker_death",
    "new_shared_tensor",
    "newer_than_tested",
    "parse_version",
    "parts",
    "pin_memory",
    "record_stream",
    "refresh",
    "set_thread_info",
    "shutdown_workers",
    "storage_from_fd",
    "storage_use_count",
    "support",
    "tensor_rule",
    "thread_info_probe",
    "thread_iterator",
    "thread_safe_generator_exists",
    "torch_check_workers",
    "torch_index_sampler",
    "worker_base_seed",
    "wrap_worker_signal_handler",
]
