"""Policies: pure functions from (requested arguments, platform) to the values a loader uses.

Nothing here reads the machine, creates processes or emits warnings. Each policy returns a
``Decision`` (value + one-line reason); ``resolve`` applies them all to a
``LoaderRequest`` and returns a ``Resolution`` holding the plan entries and the
warning texts for the caller to emit. Because every input is explicit, Windows, macOS, Python
3.14 and CUDA behaviour are tested on any machine by passing a different
``PlatformInfo``.

The rule throughout: **explicit wins**. A policy fills a value only when the caller left it
unset (``None`` for loaderkit's own defaults); torch's own values reproduce torch's behaviour.
The one exception is the Windows policy: worker processes become threads of the caller
(``force_zero_workers_on_windows=True`` loads in the main process, ``=False`` or
``worker_method="process"`` keeps processes).

Modules: ``request`` (the request, facts, decisions and the resolution), ``argcheck`` (torch's
arguments and the dataset checked with loaderkit's own messages), ``workers`` (worker
count, persistence, start method, torch's threads, the hand-off, what spawn pickles),
``methods`` (``worker_method``: processes or threads, the Windows policy, ``"auto"``'s rule),
``sampling`` (shuffling, samplers, sharding, seeds), ``resolve`` (all of them in order, pinning
and collation), ``memory`` (forked workers' memory: the copy-on-read advice, ``gc.freeze()``),
``budgets`` (will a loader fit the open-file limit and shared memory; also used by ``hdf5``),
``held`` (the bytes of whole sessions each process may hold in memory, fitted to the memory
the process may use),
``start_method`` (``fork`` where the interpreter's spawn-like default would break the script).

Decisions and checks made before a start. Imports go down only: to ``loaderkit.machine``
(the snapshots decided on), ``loaderkit.workers`` (loaderkit's collate), ``loaderkit.memory``
(the container survey), ``loaderkit.plan`` and ``loaderkit.errors``. ``planning``, ``loader``,
``hdf5`` and the command line use it.

Examples:
    >>> from loaderkit.machine.platform import detect_platform
    >>> resolve(LoaderRequest(training=True), DatasetFacts(), detect_platform()).values["shuffle"]
    True
"""

from __future__ import annotations

from loaderkit.policy.methods import WORKER_METHODS, resolve_worker_method, thread_workers_advice
from loaderkit.policy.request import (
    DatasetFacts,
    Decision,
    LoaderRequest,
    Resolution,
    SamplerChoice,
    TorchArguments,
    torch_arguments,
)
from loaderkit.policy.resolve import resolve, resolve_pin_memory
from loaderkit.policy.sampling import resolve_shuffle
from loaderkit.policy.workers import (
    HANDOFF_HELD,
    MAX_AUTO_WORKERS,
    SENT_TO_WORKERS,
    recommended_num_workers,
    resolve_handoff,
    resolve_main_threads,
    resolve_num_workers,
    resolve_persistent_workers,
    unpicklable_is_error,
)

__all__ = [
    "HANDOFF_HELD",
    "MAX_AUTO_WORKERS",
    "SENT_TO_WORKERS",
    "WORKER_METHODS",
    "DatasetFacts",
    "Decision",
    "LoaderRequest",
    "Resolution",
    "SamplerChoice",
    "TorchArguments",
    "recommended_num_workers",
    "resolve",
    "resolve_handoff",
    "resolve_main_threads",
    "resolve_num_workers",
    "resolve_persistent_workers",
    "resolve_pin_memory",
    "resolve_shuffle",
    "resolve_worker_method",
    "thread_workers_advice",
    "torch_arguments",
    "unpicklable_is_error",
]
