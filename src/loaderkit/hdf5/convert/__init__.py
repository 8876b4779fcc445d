"""Session files rewritten row by row: ``loaderkit rechunk`` and the cache's ``rows`` layout.

Imports go down only: to ``loaderkit.hdf5.read`` and ``loaderkit.hdf5.meta``. It runs in
the process that converts (``loaderkit rechunk``), or wherever the cache fetches a file.

- ``rechunk``: copies of session files with one dataset stored row by row, verified;
- ``rowcache``: ``SessionCache(layout="rows")``: the transform the cache runs on a fetched
  file, and the record a dataset keeps for such a copy.
"""
