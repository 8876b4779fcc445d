"""The finished-batch contract between a loader and a dataset (``contract``).

Modules:

- ``contract``: ``RowBatch`` (a batch read in place, the list any ``collate_fn`` sees and the
  tensor loaderkit's ``collate`` returns), ``Padded``, ``torch_dtype``, and ``BatchMemory``:
  where a reading process writes its batches (``PLAIN``, or a worker's slot handed over by the
  loader through ``LoaderSupport.use_batch_memory``).

Imports torch and numpy only; ``support``, ``workers`` and ``hdf5`` import it.
"""

from loaderkit.batches.contract import (
    PLAIN,
    BatchMemory,
    Padded,
    PlainMemory,
    RowBatch,
    torch_dtype,
)

__all__ = ["PLAIN", "BatchMemory", "Padded", "PlainMemory", "RowBatch", "torch_dtype"]
