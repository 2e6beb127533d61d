// Executing a profile: classify the addresses, then one lookup. Called for every copy, so it
// stays a few branches (the 8 B and 64 B call-cost bar: benchmarks/call_overhead.py) and is
// inline, so copy_bytes() pays no extra call for it.
#pragma once
#include "profile.h"

namespace fastcopy {
namespace policy {

inline AddressClass classify_inline(const void* dst, const void* src, std::size_t n) {
    std::uintptr_t d = reinterpret_cast<std::uintptr_t>(dst), s = reinterpret_cast<std::uintptr_t>(src);
    if (d > s && d - s < n) return AddressClass::Backward;
    std::uintptr_t off = (d - s) & 4095;  // unsigned wrap-around gives the distance mod 4096 either way
    if (off == 0) return AddressClass::PageAligned;
    return off < 64 ? AddressClass::Near : AddressClass::Far;
}

// The band of the copy's address class and size: the kernel with cached stores, where the NT
// rule does not apply (or the copy learns its store mode: copy_learning_store_mode).
inline Choice choose_band_inline(const RegionRules& rules, const void* dst, const void* src, std::size_t n) {
    const std::vector<Band>& bands = rules.cls[static_cast<int>(classify_inline(dst, src, n))];
    std::size_t i = bands.size() - 1;  // validated: at least one band, the first from 0
    while (i > 0 && bands[i].from > n) --i;
    return {bands[i].fn, bands[i].kernel};
}

inline Choice choose_inline(const Profile& p, const void* dst, const void* src, std::size_t n, Region region) {
    if (p.forced) return {p.forced, p.forced_kernel};
    const int r = static_cast<int>(region);
    if (n < p.uniform_below[r]) return {p.uniform_fn[r], p.uniform_kernel[r]};
    const RegionRules& rules = p.region[r];
    if (n >= rules.nt.threshold && nt_applies(rules.nt, dst, src, n)) return {rules.nt.fn, rules.nt.kernel};
    return choose_band_inline(rules, dst, src, n);
}

}  // namespace policy
}  // namespace fastcopy
