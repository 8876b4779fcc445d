"""What processes hold: memory, files and objects, measured and kept shareable.

Modules:

- ``sequence``: ``SharedSequence``: Python objects in one buffer that forked workers share
  without copy-on-read.
- ``preflight``: what a worker receives: the picklability check for spawn/forkserver and
  ``AttributeWalk``, the bounded walk over a dataset's attributes (what pickle sends, or what a
  forked worker inherits).
- ``containers``: large Python containers reachable from a dataset, found by that walk and
  sized by sampling (the copy-on-read survey).
- ``resources``: snapshots of what a process holds (open fds and files, children, RSS) and
  their comparison; ``leakcheck``: ``LeakCheck``, the context manager built on them.

Imports go down only: to ``loaderkit.machine``, ``loaderkit.errors`` and ``loaderkit._torch``.
``loaderkit.policy.memory`` (the copy-on-read advice) and ``planning`` use these.
"""
