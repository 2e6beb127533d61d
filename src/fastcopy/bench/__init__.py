"""The benchmarks behind ``python -m fastcopy bench`` and ``compare``, and the measurement
engine ``python -m fastcopy tune`` shares with them.

- ``engine``: buffers (hot and cold caches, POSIX shared memory), calibrated timing loops,
  interleaved repeats and their order, medians, spreads and the words for a ratio of medians;
- ``units`` (sizes, CPU lists, offsets), ``paths`` (files read and written), ``system``
  (NUMA, RAPL energy, C library, CPU model, how far apart two CPUs are, run metadata);
- the users of the engine: ``copy`` (the copy benchmark), ``batch`` (batched copies),
  ``ipc`` with its transports in ``ipc_transports`` (between two processes), ``topic``
  (fan-out to subscribers);
- ``report`` (the copy benchmark's table), ``compare`` (two runs side by side), ``plot``
  (matplotlib), ``cli`` (the ``bench`` command line).

Imported only by those commands: ``import fastcopy`` does not load it.
"""
