"""Session files rewritten row by row: ``loaderkit rechunk`` and the cache's ``rows`` layout.

Imports go down only: to ``loaderkit.hdf5.read`` and ``loaderkit.hdf5.meta``. It runs in
the process that converts (``loaderkit rechunk``), or wherever the cache fetches a file.

- ``rechunk``: copies of session files with one dataset stored row by row (or an ``.h5ad``
  CSR matrix's values uncompressed), verified: the targets planned, failures named, a
  verified copy renamed into place;
- ``blockcopy``: writing and checking one copy (objects copied, each key's values in bounded
  blocks of one reused buffer, compared with the source in the same blocks);
- ``csrcopy``: a CSR matrix group copied with ``data`` and ``indices`` uncompressed;
- ``h5copy``: the HDF5 steps of a verified copy (objects copied, one laid out anew, compared);
- ``rowcache``: ``SessionCache(layout="rows")``: the transform the cache runs on a fetched
  file, and the record a dataset keeps for such a copy.
"""
