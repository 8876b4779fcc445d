"""Reading rows out of session files: handles, raw I/O, runs, the row reader, held sessions.

Imports go down only: to ``loaderkit.hdf5.meta`` (never to ``convert``, ``remote`` or
``dataset``), and below the package to ``loaderkit.batches`` (a batch's contract and the
``BatchMemory`` it is written in, handed over by the loader: readers never ask which process
they are in) and, for the types of a lease, ``loaderkit.storage``. Sessions read from the
node cache's local copy reach the reader through the ``SessionCopies`` protocol defined here;
the remote stage provides it.

- ``hooklock``: ``HookLock``, the lock around reads that run user code or hand out h5py objects;
- ``handles``: the file pool, each process's open files (``FilePool``, ``FilePoolInfo``);
- ``uring``: many reads in one system call (Linux ``io_uring``, a ``Ring`` per thread);
- ``readtable``: the one read primitive, ``read_table``: a table of reads into one buffer (page
  cache first, the misses asked for together, or a ring while threads read), completed or
  ``ShortRead``; the only module that calls ``os.preadv``;
- ``mapped``: ``FileMaps``, whole-file read-only maps that serve warm tables of reads by copying
  (each file's size checked before every table);
- ``readahead``: the next batches' reads asked for in the sampler's order, on a background
  thread (``SamplerReadAhead``, ``Advisor``), within a stated bound;
- ``rawio``: raw locations, memory maps, chunk maps, direct ``H5Dread``, ``pread`` (one read);
- ``codecs``: HDF5 filters decoded in the reading thread;
- ``chunkio``: chunked rows read raw outside h5py (``ReadPath``);
- ``runs``: a batch cut into runs of consecutive rows, and read through a ``read_rows`` hook;
- ``widerows``: rows that span many chunks, each chunk read once;
- ``heldsessions``: whole sessions held in memory (``HeldSessions``, ``HeldInfo``);
- ``copies``: ``SessionCopies``, what a reader needs of sessions read from a local copy;
- ``sessionfiles``: ``SessionFiles``, the part a reader holds: its files, what they hold, the
  open handles and their checks;
- ``widekeys``: keys whose rows span many chunks, read apart (functions over that part);
- ``scratch``: ``ScratchRows``, a reused per-thread buffer of rows converted after reading;
- ``mappedrows``: a batch's rows gathered from memory maps;
- ``reader``: ``Reader``, the contract every reader answers (declared, nothing AnnData in it),
  ``SessionReader``, the rows of one or several keys read as stored, and ``row_batch``, keys'
  parts made into a finished batch. The AnnData package (``loaderkit.hdf5.anndata``) composes
  a ``SessionReader``; nothing here imports it.
"""
