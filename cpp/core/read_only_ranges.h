// Address ranges this process maps read-only on purpose: the data pages a fastcopy.shm consumer
// reads (a Channel's consumer end, a Topic's subscribers), so that a write through a view that
// ignores numpy's writeable flag (torch.from_numpy, ctypes) faults in the writing process
// instead of changing what other processes read. A copy whose destination overlaps one of them
// is refused before any byte moves, since writing there would end the process.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace fastcopy {
namespace core {

// [lo, lo + n) becomes read-only (read_only) or writable again (it is forgotten).
void set_read_only_range(const void* lo, std::size_t n, bool read_only);

// Forgets every range inside [base, base + n): the region is being unmapped.
void forget_read_only_ranges_in(const void* base, std::size_t n);

// True when [lo, hi) overlaps a read-only range (hi > lo).
bool overlaps_read_only_range(std::uintptr_t lo, std::uintptr_t hi);

// How many ranges there are: zero in a process that receives no views, where the check costs
// one relaxed load.
extern std::atomic<std::size_t> g_read_only_range_count;

// The check every copy makes of its destination's extent [lo, hi).
inline bool dst_is_read_only_shared(std::uintptr_t lo, std::uintptr_t hi) {
    return g_read_only_range_count.load(std::memory_order_relaxed) != 0 && hi > lo &&
           overlaps_read_only_range(lo, hi);
}
inline bool dst_is_read_only_shared(const void* p, std::size_t n) {
    const auto lo = reinterpret_cast<std::uintptr_t>(p);
    return dst_is_read_only_shared(lo, lo + n);
}

}  // namespace core
}  // namespace fastcopy
