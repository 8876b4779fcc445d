"""``HDF5SessionDataset``, the public class, and its constructor arguments.

The top stage: imports go down only, to ``loaderkit.hdf5.remote``, ``convert``, ``read`` and
``meta``, and below the package to ``loaderkit.storage``, ``loaderkit.policy.budgets`` and
``loaderkit.machine``.

- ``dataset``: the dataset class: hooks, reading, pickling; it holds the parts below and
  ``loaderkit.hdf5.read.reader.SessionReader`` and ``remote.cachedsessions.CachedSessions``;
- ``arguments``: its constructor arguments, checked and normalised once;
- ``inspection``: what every file holds, read once at construction, and the reader over it;
- ``accessors``: ``SessionAccess``, what the dataset says about its files (handles, layouts,
  types, read paths, the index);
- ``budgeting``: ``SessionBudgets``, open-file and held-session budgets;
- ``forwarding``: the dataset's names answered by a part, and the deprecated old names;
- ``h5ad``: ``H5ADDataset``, the dataset over AnnData files with their options (the form of
  a CSR batch, a gene subset, the var index).
"""
