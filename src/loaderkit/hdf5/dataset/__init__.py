"""``HDF5SessionDataset``, the public class, and its constructor arguments.

The top stage: imports go down only, to ``loaderkit.hdf5.remote``, ``convert``, ``read`` and
``meta``, and below the package to ``loaderkit.storage``, ``loaderkit.policy.budgets`` and
``loaderkit.machine``.

- ``dataset``: the dataset class: hooks, the helpers a hook calls, its constructor arguments,
  reading, pickling, and its ``LoaderSupport``; it holds
  ``loaderkit.hdf5.read.reader.SessionReader`` (the index, the open files), the parts below and
  ``remote.cachedsessions.CachedSessions`` (``ds.cached_sessions``);
- ``readmode``: which hooks a dataset class overrides, and so how it reads batches (``ReadMode``);
- ``arguments``: its constructor arguments, checked and normalised once;
- ``inspection``: what every file holds, read once at construction, and the reader over it;
- ``cells``: ``cells=``: the cells of each file chosen by a function of its obs, packed;
- ``accessors``: ``SessionHandles`` (``ds.handles``): open files, read paths, types;
- ``budgeting``: ``DatasetBudgets`` (``ds.budgets``): open-file and held-session budgets;
- ``weights``: ``balanced_weights``: per-sample weights, equal per category of an obs column
  (over the dataset's public accessors).
"""
