"""What session files hold: types, layouts, filters, the index, and why a file fails.

The bottom stage of ``loaderkit.hdf5``; it imports nothing else of ``loaderkit.hdf5`` (only
``loaderkit.errors``, ``loaderkit.batches`` for batch building, and h5py/numpy/torch). Every
other stage imports it.

- ``types``: HDF5 type -> what a sample's row becomes (``RowType``), and the types refused;
- ``layout``: per-session layout of a key (``SessionLayout``), chunk buffer, hints,
  ``dataset_names``;
- ``columnblocks``: blocks of whole chunks along the columns of rows that span many chunks;
- ``btree1``: a chunked dataset's chunk index read from its version-1 B-tree in numpy
  (``ChunkRecords``), the reads performed by the caller's ``ReadTable``;
- ``filters``: whether every compression filter a dataset needs is available;
- ``index``: the packed sample index (``SampleIndex``, ``ROW_BITS``/``ROW_MASK``);
- ``diagnose``: why a file failed, established by checks;
- ``keyspecs``: ``KeySpec`` (where a key's rows lie), ``SessionRecord`` (what a file held);
- ``inventory``: ``parse_keys`` and ``inspect_session``: what each file holds of the keys;
- ``anndata``: AnnData's encodings (CSR/CSC groups, legacy ``h5sparse``, categorical
  columns, the var index): what a group is and where a row's bytes are;
- ``obs``: a file's ``obs`` table as ``cells=`` sees it (``ObsTable``: columns read on demand).
"""
