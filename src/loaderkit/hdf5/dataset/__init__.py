"""``HDF5SessionDataset``, the public class, and its constructor arguments.

The top stage: imports go down only, to ``loaderkit.hdf5.remote``, ``convert``, ``read`` and
``meta``, and below the package to ``loaderkit.storage``, ``loaderkit.policy.budgets`` and
``loaderkit.machine``.

- ``dataset``: the dataset class: hooks, reading, pickling;
- ``arguments``: its constructor arguments, checked and normalised once;
- ``inspection``: what every file holds, read once at construction, and the reader over it;
- ``accessors``: what the dataset says about its files: handles, layouts, types, the index;
- ``budgeting``: open-file and held-session budgets.
"""
