"""Which samples, in what order: seeds, samplers, resume, reading ahead.

Modules:

- ``seeding``: reproducible, collision-free random streams in every process, worker, rank and
  epoch (``seed_everything``, ``make_generator``, ``seed_worker``, ``worker_rng``); per worker
  thread where the worker is a thread.
- ``determinism``: ``check_determinism``: two loaders compared bit for bit; the shared random
  states worker threads drew from, named.
- ``sample_seeding``: ``sample_seeding=True``: batches tagged with their epoch, samples seeded
  one by one *in the workers*.
- ``samplers``: the samplers loaderkit builds for ``torch.distributed`` (``ElasticSampler``,
  ``ShardSampler``) and the global-batch arithmetic.
- ``mixing``: ``batch_mix`` and ``order_mix``: how well an order mixes, the mean per-batch
  entropy of a label (the file, an ``obs`` column) over its entropy in all, from the indices.
- ``weighted``: ``WeightedSampler``: draws in proportion to per-sample weights, from
  ``(seed, epoch)``, one global sequence cut into the ranks' global batches, resumable.
- ``resume``: a loader's state and the index-level fast-forward;
- ``statecheck``: ``check_state``, whether a saved state fits a loader (re-exported by
  ``resume``).
- ``lookahead``: a pass's indices drawn a little ahead, for datasets that fetch what comes next.
- ``hooks``: ``call_hook``: the optional duck-typed ``set_epoch``/``close`` hooks of samplers
  and datasets.

Imports go down only: to ``loaderkit.machine`` (ranks), ``loaderkit.workers`` (whether a
worker shares its batches, the current worker thread), ``loaderkit.support`` (what a dataset
says of its samples), ``loaderkit._torch`` and ``loaderkit.errors``.
"""
