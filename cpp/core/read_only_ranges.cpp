// The read-only ranges of this process (read_only_ranges.h): a short list under a mutex. The
// mutex is held for a few instructions, never while waiting for anything; fork() takes it
// first (pthread_atfork), so a child never starts with it locked.
#include "core/read_only_ranges.h"

#include <pthread.h>

#include <algorithm>
#include <mutex>
#include <vector>

namespace fastcopy {
namespace core {

std::atomic<std::size_t> g_read_only_range_count{0};

namespace {

struct Range {
    std::uintptr_t lo, hi;
};

std::mutex& ranges_mutex() {
    static auto* m = new std::mutex();  // never destroyed: copies may run at interpreter exit
    return *m;
}

std::vector<Range>& ranges() {
    static auto* r = new std::vector<Range>();
    return *r;
}

struct HeldOverFork {
    HeldOverFork() {
        pthread_atfork([] { ranges_mutex().lock(); }, [] { ranges_mutex().unlock(); },
                       [] { ranges_mutex().unlock(); });
    }
} g_held_over_fork;

void publish_count() { g_read_only_range_count.store(ranges().size(), std::memory_order_relaxed); }

}  // namespace

void set_read_only_range(const void* lo, std::size_t n, bool read_only) {
    const auto a = reinterpret_cast<std::uintptr_t>(lo);
    std::lock_guard<std::mutex> lock(ranges_mutex());
    auto& r = ranges();
    r.erase(std::remove_if(r.begin(), r.end(), [&](const Range& x) { return x.lo == a; }), r.end());
    if (read_only && n) r.push_back({a, a + n});
    publish_count();
}

void forget_read_only_ranges_in(const void* base, std::size_t n) {
    const auto a = reinterpret_cast<std::uintptr_t>(base);
    std::lock_guard<std::mutex> lock(ranges_mutex());
    auto& r = ranges();
    r.erase(std::remove_if(r.begin(), r.end(), [&](const Range& x) { return x.lo >= a && x.hi <= a + n; }), r.end());
    publish_count();
}

bool overlaps_read_only_range(std::uintptr_t lo, std::uintptr_t hi) {
    std::lock_guard<std::mutex> lock(ranges_mutex());
    for (const Range& x : ranges())
        if (lo < x.hi && x.lo < hi) return true;
    return false;
}

}  // namespace core
}  // namespace fastcopy
