"""What runs inside worker processes, and the hand-off of their batches to the main process.

Modules, and where each runs:

- ``worker``: *inside each worker*: the shared-batch switch and the slot pool a worker lays
  its batches out in (``HandoffCollate``).
- ``wire``: the slot layout and the messages, *both sides* of the hand-off.
- ``handoff``: *main process*: slots mapped once and lent out per batch (``Receiver``).
- ``queues``: queues between the processes whose small messages skip the feeder thread.
- ``collate``: batch buffers read straight into their final tensor (in a worker's slot or
  shared memory), ``pad_collate`` and loaderkit's collate; *in workers* (or the main process
  without workers).
- ``collate_context``: collate errors that name the batch size, process and worker.
- ``deaths``: what a dead worker means: the error naming its pid, signal and cause.
- ``threadworkers``: worker *threads* of the calling process: the carrier that runs the same worker
  contract as a process, per-thread worker info and streams, bounded stop; its lock map.
- ``teardown``: stopping a pass's workers within bounded time, closing what it holds.

Imports go down only: to ``loaderkit._torch`` and ``loaderkit.errors``. The layers above
(``order``, ``policy``, ``hdf5``, the loader's ``passes``) use these; nothing here imports them.
"""
