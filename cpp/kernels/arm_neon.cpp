// ASIMD (NEON) copy kernel: 16-byte vectors, present on every aarch64 CPU.
//   n <= 128 : size classes with overlapping head/tail moves; all loads before any store,
//              so any overlap is handled.
//   n >  128 : head and tail kept in registers, a 64-byte loop with 16-byte-aligned stores
//              runs forward (dst <= src or disjoint) or backward (dst inside (src, src+n)),
//              then head and tail are stored.
// No access leaves [src, src+n) / [dst, dst+n).
#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "kernels.h"

namespace fastcopy {
namespace {

using u8 = unsigned char;

template <class T>
inline T load_as(const u8* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}
template <class T>
inline void store_as(u8* p, T v) {
    std::memcpy(p, &v, sizeof(T));
}

inline void copy_small(u8* d, const u8* s, std::size_t n) {
    if (n <= 16) {
        if (n >= 8) {
            auto a = load_as<std::uint64_t>(s), b = load_as<std::uint64_t>(s + n - 8);
            store_as(d, a);
            store_as(d + n - 8, b);
        } else if (n >= 4) {
            auto a = load_as<std::uint32_t>(s), b = load_as<std::uint32_t>(s + n - 4);
            store_as(d, a);
            store_as(d + n - 4, b);
        } else if (n >= 2) {
            auto a = load_as<std::uint16_t>(s), b = load_as<std::uint16_t>(s + n - 2);
            store_as(d, a);
            store_as(d + n - 2, b);
        } else if (n == 1) {
            *d = *s;
        }
        return;
    }
    if (n <= 32) {
        uint8x16_t a = vld1q_u8(s), b = vld1q_u8(s + n - 16);
        vst1q_u8(d, a);
        vst1q_u8(d + n - 16, b);
        return;
    }
    if (n <= 64) {
        uint8x16_t a = vld1q_u8(s), b = vld1q_u8(s + 16), c = vld1q_u8(s + n - 32),
                   e = vld1q_u8(s + n - 16);
        vst1q_u8(d, a);
        vst1q_u8(d + 16, b);
        vst1q_u8(d + n - 32, c);
        vst1q_u8(d + n - 16, e);
        return;
    }
    uint8x16_t a0 = vld1q_u8(s), a1 = vld1q_u8(s + 16), a2 = vld1q_u8(s + 32), a3 = vld1q_u8(s + 48);
    uint8x16_t b0 = vld1q_u8(s + n - 64), b1 = vld1q_u8(s + n - 48), b2 = vld1q_u8(s + n - 32),
               b3 = vld1q_u8(s + n - 16);
    vst1q_u8(d, a0);
    vst1q_u8(d + 16, a1);
    vst1q_u8(d + 32, a2);
    vst1q_u8(d + 48, a3);
    vst1q_u8(d + n - 64, b0);
    vst1q_u8(d + n - 48, b1);
    vst1q_u8(d + n - 32, b2);
    vst1q_u8(d + n - 16, b3);
}

// n > 128; dst <= src or disjoint.
void copy_fwd(u8* d, const u8* s, std::size_t n) {
    const uint8x16_t head = vld1q_u8(s);
    const uint8x16_t t0 = vld1q_u8(s + n - 64), t1 = vld1q_u8(s + n - 48),
                     t2 = vld1q_u8(s + n - 32), t3 = vld1q_u8(s + n - 16);
    std::size_t i = (0u - reinterpret_cast<std::uintptr_t>(d)) & 15u;
    for (; n - i > 64; i += 64) {
        uint8x16_t v0 = vld1q_u8(s + i), v1 = vld1q_u8(s + i + 16), v2 = vld1q_u8(s + i + 32),
                   v3 = vld1q_u8(s + i + 48);
        vst1q_u8(d + i, v0);
        vst1q_u8(d + i + 16, v1);
        vst1q_u8(d + i + 32, v2);
        vst1q_u8(d + i + 48, v3);
    }
    vst1q_u8(d + n - 64, t0);
    vst1q_u8(d + n - 48, t1);
    vst1q_u8(d + n - 32, t2);
    vst1q_u8(d + n - 16, t3);
    vst1q_u8(d, head);
}

// n > 128; dst >= src or disjoint.
void copy_bwd(u8* d, const u8* s, std::size_t n) {
    const uint8x16_t tail = vld1q_u8(s + n - 16);
    const uint8x16_t h0 = vld1q_u8(s), h1 = vld1q_u8(s + 16), h2 = vld1q_u8(s + 32),
                     h3 = vld1q_u8(s + 48);
    std::size_t i = n - (reinterpret_cast<std::uintptr_t>(d + n) & 15u);
    while (i > 64) {
        i -= 64;
        uint8x16_t v0 = vld1q_u8(s + i), v1 = vld1q_u8(s + i + 16), v2 = vld1q_u8(s + i + 32),
                   v3 = vld1q_u8(s + i + 48);
        vst1q_u8(d + i + 48, v3);
        vst1q_u8(d + i + 32, v2);
        vst1q_u8(d + i + 16, v1);
        vst1q_u8(d + i, v0);
    }
    vst1q_u8(d, h0);
    vst1q_u8(d + 16, h1);
    vst1q_u8(d + 32, h2);
    vst1q_u8(d + 48, h3);
    vst1q_u8(d + n - 16, tail);
}

}  // namespace

void copy_neon(void* dst, const void* src, std::size_t n) {
    auto* d = static_cast<u8*>(dst);
    auto* s = static_cast<const u8*>(src);
    if (n <= 128) {
        copy_small(d, s, n);
        return;
    }
    const std::uintptr_t diff = reinterpret_cast<std::uintptr_t>(d) - reinterpret_cast<std::uintptr_t>(s);
    if (diff == 0) return;
    if (diff < n)
        copy_bwd(d, s, n);
    else
        copy_fwd(d, s, n);
}

}  // namespace fastcopy
