// Executing a profile: classify the addresses, then one lookup; the smallest sizes, where no
// class differs, skip both (Profile::uniform). Called for every copy, so it stays a few
// branches (the 8 B and 64 B call-cost bar: benchmarks/call_overhead.py) and is inline, so
// copy_bytes() pays no extra call for it.
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

// The band of `bands` that holds size n: the last one starting at or below it (validated: at
// least one band, the first from 0).
inline const Band& band_holding(const std::vector<Band>& bands, std::size_t n) {
    std::size_t i = bands.size() - 1;
    while (i > 0 && bands[i].from > n) --i;
    return bands[i];
}

// The band of the copy's address class and size: the kernel with cached stores, where the NT
// rule does not apply (or the copy learns its store mode: copy_learning_store_mode).
inline Choice choose_band_inline(const RegionRules& rules, const void* dst, const void* src, std::size_t n) {
    const Band& b = band_holding(rules.cls[static_cast<int>(classify_inline(dst, src, n))], n);
    return {b.fn, b.kernel};
}

inline Choice choose_inline(const Profile& p, const void* dst, const void* src, std::size_t n, Region region) {
    if (p.forced) return {p.forced, p.forced_kernel};
    const int r = static_cast<int>(region);
    static_assert(kUniformBands == 4, "the compares below read from[1..3]");
    const UniformBands& u = p.uniform[r];
    if (n < u.below) {
        const int i = int(n >= u.from[1]) + int(n >= u.from[2]) + int(n >= u.from[3]);
        return {u.fn[i], u.kernel[i]};
    }
    const RegionRules& rules = p.region[r];
    if (n >= rules.nt.threshold && nt_applies(rules.nt, dst, src, n)) return {rules.nt.fn, rules.nt.kernel};
    return choose_band_inline(rules, dst, src, n);
}

}  // namespace policy
}  // namespace fastcopy
