// Persistent worker pool for large copies. Started lazily by the first parallel copy,
// never at import. Knows nothing about policy: dispatch decides when to call it.
#pragma once
#include <cstddef>
#include <string>

#include "kernels/kernels.h"

namespace fastcopy {
namespace pool {

// Threads (caller included) a parallel copy uses now: set_threads() value, else
// FASTCOPY_THREADS, else default_threads().
unsigned threads();
// From sched_getaffinity and the cgroup CPU quota (cpu.max / cfs_quota_us).
unsigned default_threads();
// Plain words on where threads() came from, for info().
std::string threads_reason();
// n >= 1; 1 disables threading. 0 restores the default. Safe while copies run.
void set_threads(unsigned n);

// Copies n bytes from src to dst, cut into cache-line-aligned chunks, each copied by
// `kernel` on one of threads() threads (the caller takes a share). Blocks until all chunks
// are done. Precondition: the ranges do not overlap (dispatch guarantees it). When the pool
// is busy with another caller's copy, or threads() == 1, the caller copies alone.
void parallel_copy(void* dst, const void* src, std::size_t n, CopyFn kernel);

}  // namespace pool
}  // namespace fastcopy
