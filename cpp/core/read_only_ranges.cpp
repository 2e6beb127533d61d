// The read-only ranges of this process (read_only_ranges.h). Copies read the table on every
// call while a view is received, so reading takes no lock: a sequence count, odd while a writer
// changes the table, tells a reader to look again (a seqlock). Writers (a consumer end mapped or
// unmapped: rare) hold a mutex; fork() takes it first (pthread_atfork), so a child never starts
// with a change half made. The table holds kTableRanges ranges; beyond that (a process with more
// consumer ends at once) the rest are kept in a list read under the mutex.
#include "core/read_only_ranges.h"

#include <pthread.h>

#include <algorithm>
#include <mutex>
#include <vector>

namespace fastcopy {
namespace core {

std::atomic<std::size_t> g_read_only_range_count{0};

namespace {

constexpr std::size_t kTableRanges = 256;

struct Range {
    std::uintptr_t lo, hi;
};

// The table: entries [0, g_used) with hi == 0 are free. Fields are atomics so that a reader
// racing a writer reads some value (and then looks again), never a torn one.
std::atomic<std::uintptr_t> g_lo[kTableRanges];
std::atomic<std::uintptr_t> g_hi[kTableRanges];
std::atomic<std::size_t> g_used{0};
std::atomic<std::uint64_t> g_seq{0};
std::atomic<bool> g_overflowed{false};

std::mutex& writers_mutex() {
    static auto* m = new std::mutex();  // never destroyed: copies may run at interpreter exit
    return *m;
}

std::vector<Range>& overflow() {  // under writers_mutex
    static auto* r = new std::vector<Range>();
    return *r;
}

struct HeldOverFork {
    HeldOverFork() {
        pthread_atfork([] { writers_mutex().lock(); }, [] { writers_mutex().unlock(); },
                       [] { writers_mutex().unlock(); });
    }
} g_held_over_fork;

// A change of the table, between these two (writers_mutex held).
void begin_change() {
    g_seq.fetch_add(1, std::memory_order_relaxed);  // odd: readers look again
    std::atomic_thread_fence(std::memory_order_release);
}
void end_change() { g_seq.fetch_add(1, std::memory_order_release); }

void remove_where(std::uintptr_t lo_at_least, std::uintptr_t hi_at_most, bool exact_lo) {
    const std::size_t used = g_used.load(std::memory_order_relaxed);
    for (std::size_t i = 0; i < used; ++i) {
        const std::uintptr_t lo = g_lo[i].load(std::memory_order_relaxed);
        const std::uintptr_t hi = g_hi[i].load(std::memory_order_relaxed);
        if (hi && (exact_lo ? lo == lo_at_least : lo >= lo_at_least && hi <= hi_at_most)) {
            g_hi[i].store(0, std::memory_order_relaxed);
            g_lo[i].store(0, std::memory_order_relaxed);
        }
    }
    std::size_t n = used;
    while (n && g_hi[n - 1].load(std::memory_order_relaxed) == 0) --n;
    g_used.store(n, std::memory_order_relaxed);
    auto& r = overflow();
    r.erase(std::remove_if(r.begin(), r.end(),
                           [&](const Range& x) {
                               return exact_lo ? x.lo == lo_at_least : x.lo >= lo_at_least && x.hi <= hi_at_most;
                           }),
            r.end());
    g_overflowed.store(!r.empty(), std::memory_order_relaxed);
}

void publish_count() {
    std::size_t n = overflow().size();
    const std::size_t used = g_used.load(std::memory_order_relaxed);
    for (std::size_t i = 0; i < used; ++i) n += g_hi[i].load(std::memory_order_relaxed) != 0;
    g_read_only_range_count.store(n, std::memory_order_relaxed);
}

}  // namespace

void set_read_only_range(const void* lo, std::size_t n, bool read_only) {
    const auto a = reinterpret_cast<std::uintptr_t>(lo);
    std::lock_guard<std::mutex> lock(writers_mutex());
    begin_change();
    remove_where(a, 0, true);
    if (read_only && n) {
        std::size_t i = 0;
        const std::size_t used = g_used.load(std::memory_order_relaxed);
        while (i < used && g_hi[i].load(std::memory_order_relaxed) != 0) ++i;
        if (i < kTableRanges) {
            g_lo[i].store(a, std::memory_order_relaxed);
            g_hi[i].store(a + n, std::memory_order_relaxed);
            if (i == used) g_used.store(used + 1, std::memory_order_relaxed);
        } else {
            overflow().push_back({a, a + n});
            g_overflowed.store(true, std::memory_order_relaxed);
        }
    }
    end_change();
    publish_count();
}

void forget_read_only_ranges_in(const void* base, std::size_t n) {
    const auto a = reinterpret_cast<std::uintptr_t>(base);
    std::lock_guard<std::mutex> lock(writers_mutex());
    begin_change();
    remove_where(a, a + n, false);
    end_change();
    publish_count();
}

bool overlaps_read_only_range(std::uintptr_t lo, std::uintptr_t hi) {
    bool hit;
    for (;;) {
        const std::uint64_t before = g_seq.load(std::memory_order_acquire);
        if (before & 1) continue;  // a writer is changing the table (a few instructions)
        hit = false;
        const std::size_t used = g_used.load(std::memory_order_relaxed);
        for (std::size_t i = 0; i < used && !hit; ++i) {
            const std::uintptr_t h = g_hi[i].load(std::memory_order_relaxed);
            hit = h && lo < h && g_lo[i].load(std::memory_order_relaxed) < hi;
        }
        std::atomic_thread_fence(std::memory_order_acquire);
        if (g_seq.load(std::memory_order_relaxed) == before) break;
    }
    if (!hit && g_overflowed.load(std::memory_order_relaxed)) {
        std::lock_guard<std::mutex> lock(writers_mutex());
        for (const Range& x : overflow())
            if (lo < x.hi && x.lo < hi) return true;
    }
    return hit;
}

}  // namespace core
}  // namespace fastcopy
