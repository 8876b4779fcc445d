"""Sessions read through a node cache (``loaderkit.storage.SessionCache``).

Imports go down only: to ``loaderkit.hdf5.convert``, ``loaderkit.hdf5.read`` and
``loaderkit.hdf5.meta``, and to ``loaderkit.storage``, which does the fetching (and
``loaderkit.machine.distributed`` for the ranks on a node).

- ``sources``: which sessions, leases, the prefetch window, and the ``OrderWatcher`` the
  loader feeds (``SessionSources`` is the reader's ``SessionCopies``);
- ``remotemeta``: what remote files hold, read by range requests, kept in the cache directory;
- ``cachedsessions``: what a dataset read through the cache adds: fetch order, budgets, plan
  rows and statistics.
"""
