"""The names of ``python -m fastcopy bench``'s former single module, kept for scripts and tests
that import ``fastcopy.bench``. The code lives in the ``fastcopy.measure`` package:

- ``measure.units``: parsing and formatting sizes, CPU lists, offsets;
- ``measure.engine``: buffers (hot and cold caches, POSIX shared memory), variants, timing loops,
  interleaved repeats, medians and spreads;
- ``measure.system``: NUMA, RAPL energy, C library, CPU model, run metadata;
- ``measure.report``: the header, the table, ucx_info's block;
- ``measure.cli``: the ``bench`` command line; ``measure.tune``: ``python -m fastcopy tune``.
"""

from __future__ import annotations

from .measure.engine import (BASELINE, CACHE_MODES, Buffers, Progress, SharedBuffer, Variant, aligned_buffer,
                             available_variants, cache_sizes, callable_variant, cold_rotation_count, run_bench,
                             select_variants, spread, time_interleaved)
from .measure.report import cache_words, format_table, format_ucx, header_lines, slowest_offset
from .measure.system import (SCHEMA, Rapl, buffer_numa_pages, cpu_model_name, libc_info, metadata, numa_nodes,
                             numa_report)
from .measure.units import (DEFAULT_SIZES, MIXED_OFFSETS, PAGE, QUICK_SIZES, UCX_SIZES, format_cpus, human_size,
                            parse_cpus, parse_offsets, parse_size, parse_sizes)

__all__ = ["BASELINE", "CACHE_MODES", "Buffers", "Progress", "SharedBuffer", "Variant", "aligned_buffer",
           "available_variants", "cache_sizes", "callable_variant", "cold_rotation_count", "run_bench",
           "select_variants", "spread", "time_interleaved", "cache_words", "format_table", "format_ucx",
           "header_lines", "slowest_offset", "SCHEMA", "Rapl", "buffer_numa_pages", "cpu_model_name", "libc_info",
           "metadata", "numa_nodes", "numa_report", "DEFAULT_SIZES", "MIXED_OFFSETS", "PAGE", "QUICK_SIZES",
           "UCX_SIZES", "format_cpus", "human_size", "parse_cpus", "parse_offsets", "parse_size", "parse_sizes"]
