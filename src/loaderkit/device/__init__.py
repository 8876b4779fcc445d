"""To the GPU: batches moved to a device, one ahead on a side stream.

Modules:

- ``transfer``: ``to_device`` and the per-tensor ``non_blocking`` decision
  (``resolve_non_blocking``).
- ``prefetch``: ``DevicePrefetcher``: the next batch copied while this one is used.

Runs in the training process, after the loader. Imports go down only: ``transfer`` to
``loaderkit._torch`` and ``loaderkit.errors``, ``prefetch`` to ``transfer`` and
``loaderkit.order.hooks``; the loader never imports this folder.
"""
