"""What this machine and its torch are: read once, handed to everything that decides.

Detection lives here and nowhere else; the layers above receive its snapshots and decide.

Modules:

- ``platform``: ``PlatformInfo`` and ``detect_platform()``: the OS, start methods, CPUs,
  memory, limits, CUDA, torch's fallbacks (the only module that reads the machine).
- ``cgroups``: the memory limit and CPU quota on the process's own cgroup path (v1 and v2,
  Slurm's and systemd's nested paths, containers), read from ``/proc/self`` and the cgroup
  filesystems (``platform`` asks it; detection only).
- ``distributed``: rank, world and local world (the only reader of ``RANK``, ``WORLD_SIZE``,
  ``LOCAL_WORLD_SIZE`` and ``torch.distributed``).
- ``intraop_threads``: torch's intra-op thread count, and lowering it while a pass runs.
- ``versions``: the torch a loader runs on: which arguments it takes, what falls back.
- ``main_module``: whether the main script's top level would run again in a spawned or
  forkserver worker (the call outside every ``__name__ == "__main__"`` guard).

Imports go down only: to ``loaderkit._torch``, ``loaderkit.errors`` and ``loaderkit.plan``
(``versions`` answers in ``Decision``). Nothing here imports another loaderkit folder.
"""
