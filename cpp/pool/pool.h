// Persistent worker pool for large copies. Started lazily by the first parallel copy,
// never at import. Knows nothing about policy: dispatch decides when to call it.
// How it works, sizing, fork and concurrency behaviour: docs/threads.md.
#pragma once
#include <cstddef>
#include <cstdint>
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

// What one split copy did: the chunks the workers copied (0: the caller copied everything
// itself, for whatever reason), and whether a worker had to be woken from sleep for it (it then
// joins late: such a copy times the wake-up as much as the split).
struct SplitResult {
    std::size_t worker_chunks = 0;
    bool woke_worker = false;
};

// Copies n bytes from src to dst, cut into cache-line-aligned chunks, each copied by
// `kernel` on one of threads() threads (the caller takes a share). Blocks until all chunks
// are done. Precondition: the ranges do not overlap (dispatch guarantees it). When the pool
// is busy with another caller's copy, or threads() == 1, the caller copies alone.
SplitResult parallel_copy(void* dst, const void* src, std::size_t n, CopyFn kernel);

// parallel_copy on `threads_wanted` threads (caller included; 1..kMaxThreads) instead of
// threads(): for fastcopy.kernel(name, threads=N), which tune uses to measure each thread
// count. The pool is resized to that count when it differs (costly: keep one count per run).
SplitResult parallel_copy_threads(void* dst, const void* src, std::size_t n, CopyFn kernel, unsigned threads_wanted);

// Calls item(ctx, i) once for every i in [0, n), spread over threads() threads (the caller
// takes a share, items are taken in order from one counter); blocks until all are done.
// Items must be independent (no order between them). Same pool, busy fallback and back-off
// as parallel_copy: when another caller holds the pool, or threads() == 1, the caller runs
// every item itself, in order. For batched copies (many blocks, one GIL release).
void parallel_for(std::size_t n, void (*item)(void* ctx, std::size_t index), void* ctx);

// ---- Extensions (pool helper) ----------------------------------------------------------

// The FASTCOPY_THREADS layer, kept apart from set_threads() so that set_threads(0) goes
// back to the environment value rather than past it. 0 = variable not set. dispatch may
// call this at import instead of set_threads(n); threads_reason() then names the variable.
void set_env_threads(unsigned n);

// Largest thread count set_threads()/FASTCOPY_THREADS may ask for (larger is clamped).
constexpr unsigned kMaxThreads = 1024;
// Cap on default_threads(): one copy rarely gains from more threads than this, and more
// would take cores from the caller's other threads.
constexpr unsigned kDefaultThreadsCap = 8;
// An isolated copy (the previous one that reached the pool ended more than kIsolatedGapNs
// ago) smaller than kWakeWorkersMinBytes does not wake sleeping workers: the caller copies
// alone. Waking one costs the caller a FUTEX_WAKE and the worker tens of microseconds under a
// hypervisor, which a copy this small does not win back. Copies closer together still wake
// the workers: skipping the wake for them slows ping-pongs between processes
// (evidence: pool-isolated-copies, pool-handoff-cost).
constexpr std::size_t kWakeWorkersMinBytes = 2u << 20;
constexpr std::int64_t kIsolatedGapNs = 500'000;  // 500 us, in ns
// How long an idle worker spins (with sched_yield() after the first 1 us) before it sleeps on
// its futex. After a copy that came as part of a stream (within kIsolatedGapNs of the previous
// one) it spins kIsolatedGapNs, so that the stream's next copy finds it awake; after an isolated
// copy, kWorkerSpinNs (enough for back-to-back copies). Waking a sleeping worker costs the
// caller a FUTEX_WAKE and the copy the worker's late start, tens of microseconds under a
// hypervisor; with a short spin after every copy, copies a few hundred microseconds apart ran
// slower on two threads than on one (evidence: pool-worker-spin-stream). The cost: in a
// stream with gaps of 100-450 us a worker spins through them (up to a CPU busy, yielding to
// other threads).
constexpr std::int64_t kWorkerSpinNs = 50'000;  // 50 us, in ns
constexpr std::int64_t worker_spin_ns(std::int64_t gap_before_copy_ns) {
    return gap_before_copy_ns < kIsolatedGapNs ? kIsolatedGapNs : kWorkerSpinNs;
}

// Smallest chunk parallel_copy cuts (bytes, a multiple of 64).
constexpr std::size_t kMinChunkBytes = 16 * 1024;

// parallel_copy with an explicit chunk size (rounded up to a multiple of 64; chunk
// boundaries fall on 64-byte-aligned dst addresses). For tests and benchmarks.
SplitResult parallel_copy_chunked(void* dst, const void* src, std::size_t n, CopyFn kernel,
                                  std::size_t chunk_bytes);

// Round trip of an empty job through one already started worker (starting the pool if
// needed): returns false when the pool is busy or threads() == 1. For the hand-off benchmark.
bool ping();

// The cgroup CPU quota in CPUs (0 = none) that a /proc/self/cgroup text gives under a cgroup
// mount root (normally "/sys/fs/cgroup"): the smallest cgroup v2 cpu.max or v1
// cfs_quota_us/cfs_period_us from the process's cgroup up to the root. `source` gets the file
// it came from. Linux only (0 elsewhere). default_threads() uses it; exposed for tests.
double cgroup_cpu_quota(const std::string& cgroup_text, const std::string& mount_root,
                        std::string* source = nullptr);

// Workers currently started (0 before the first parallel copy and in a forked child).
unsigned started_workers();

// Started workers that sleep on their futex now (a snapshot). Tests use it to know that the
// next copy finds the workers asleep, which the isolated-copy rule depends on.
unsigned sleeping_workers();

// The spin (ns) the last split copy set for the workers (worker_spin_ns of its gap; kWorkerSpinNs
// before the first, and with set_adaptive(false)). For tests of that rule.
std::int64_t worker_spin_now_ns();

// The spin (ns) the first worker took when it last became idle (worker_spin_ns of the copy it
// helped; 0 before the pool starts). For tests of that rule.
std::int64_t last_worker_spin_ns();

struct Stats {
    std::uint64_t parallel_copies = 0;  // copies that used the pool
    std::uint64_t busy_fallbacks = 0;   // copies done alone because another caller held the pool
    std::uint64_t chunks_by_workers = 0;  // chunks copied by workers (not the caller)
    std::uint64_t pools_started = 0;    // pool (re)builds, e.g. after fork
    std::uint64_t late_events = 0;      // copies where the caller waited long for a worker
    std::uint64_t backoff_fallbacks = 0;  // copies done alone during the back-off after one
    std::uint64_t asleep_fallbacks = 0;  // isolated copies under 2 MiB done alone: the workers slept
    std::uint64_t worker_sleeps = 0;     // times a worker stopped spinning and slept on its futex
};

// Adaptive back-off, on by default: when the caller had to wait for a worker much longer
// than a chunk takes (the worker was descheduled: the machine is oversubscribed), the next
// copies for 1 ms (doubling while it repeats, up to 100 ms) run on the caller alone. Tests
// and benchmarks that need every copy split turn it off (it also turns off the rule that an
// isolated copy under 2 MiB does not wake sleeping workers: see kWakeWorkersMinBytes, and the
// longer spin of workers within a stream of copies: see worker_spin_ns).
void set_adaptive(bool on);
Stats stats();

}  // namespace pool
}  // namespace fastcopy
