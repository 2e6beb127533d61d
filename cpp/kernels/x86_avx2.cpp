// AVX2 copy kernels (32-byte vectors). Compiled with per-function target attributes only,
// so this file adds no AVX2 instruction to code that runs on CPUs without it.
//
// Shape of both kernels:
//   n <= 256     : size classes; every load happens before any store, each class uses two
//                  (or more) overlapping unaligned moves that stay inside [0, n). That makes
//                  them correct for any overlap, in either direction.
//   n >  256     : head and tail are loaded into registers first, then a 4x32-byte loop with
//                  32-byte-aligned stores runs forward or backward, and the saved head/tail
//                  are stored last. Every store writes the original source byte for its
//                  position, so the result equals memmove's.
// No access ever leaves [src, src+n) / [dst, dst+n): tails use overlapping loads inside the
// range rather than reading past the end.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels.h"

#define FC_AVX2 __attribute__((target("avx2"), always_inline)) inline

namespace fastcopy {
namespace {

using u8 = unsigned char;

FC_AVX2 __m256i ld(const u8* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
FC_AVX2 void st(u8* p, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
FC_AVX2 void sta(u8* p, __m256i v) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), v); }
FC_AVX2 void stnt(u8* p, __m256i v) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v); }

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

// 0 <= n <= 256, any overlap.
__attribute__((target("avx2"))) void copy_small(u8* d, const u8* s, std::size_t n) {
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
        __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
        __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + n - 16));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d), a);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + n - 16), b);
        return;
    }
    if (n <= 64) {
        __m256i a = ld(s), b = ld(s + n - 32);
        st(d, a);
        st(d + n - 32, b);
        return;
    }
    if (n <= 128) {
        __m256i a = ld(s), b = ld(s + 32), c = ld(s + n - 64), e = ld(s + n - 32);
        st(d, a);
        st(d + 32, b);
        st(d + n - 64, c);
        st(d + n - 32, e);
        return;
    }
    __m256i a0 = ld(s), a1 = ld(s + 32), a2 = ld(s + 64), a3 = ld(s + 96);
    __m256i b0 = ld(s + n - 128), b1 = ld(s + n - 96), b2 = ld(s + n - 64), b3 = ld(s + n - 32);
    st(d, a0);
    st(d + 32, a1);
    st(d + 64, a2);
    st(d + 96, a3);
    st(d + n - 128, b0);
    st(d + n - 96, b1);
    st(d + n - 64, b2);
    st(d + n - 32, b3);
}

// n > 256. Forward: correct when dst <= src or the ranges do not overlap.
__attribute__((target("avx2"))) void copy_fwd(u8* d, const u8* s, std::size_t n) {
    const __m256i head = ld(s);
    const __m256i t0 = ld(s + n - 128), t1 = ld(s + n - 96), t2 = ld(s + n - 64),
                  t3 = ld(s + n - 32);
    std::size_t i = (0u - reinterpret_cast<std::uintptr_t>(d)) & 31u;  // d + i is 32-aligned
    for (; n - i > 128; i += 128) {
        __m256i v0 = ld(s + i), v1 = ld(s + i + 32), v2 = ld(s + i + 64), v3 = ld(s + i + 96);
        sta(d + i, v0);
        sta(d + i + 32, v1);
        sta(d + i + 64, v2);
        sta(d + i + 96, v3);
    }
    st(d + n - 128, t0);
    st(d + n - 96, t1);
    st(d + n - 64, t2);
    st(d + n - 32, t3);
    st(d, head);
}

// n > 256. Backward: correct when dst >= src or the ranges do not overlap.
__attribute__((target("avx2"))) void copy_bwd(u8* d, const u8* s, std::size_t n) {
    const __m256i tail = ld(s + n - 32);
    const __m256i h0 = ld(s), h1 = ld(s + 32), h2 = ld(s + 64), h3 = ld(s + 96);
    std::size_t i = n - (reinterpret_cast<std::uintptr_t>(d + n) & 31u);  // d + i 32-aligned
    while (i > 128) {
        i -= 128;
        __m256i v0 = ld(s + i), v1 = ld(s + i + 32), v2 = ld(s + i + 64), v3 = ld(s + i + 96);
        sta(d + i + 96, v3);
        sta(d + i + 64, v2);
        sta(d + i + 32, v1);
        sta(d + i, v0);
    }
    st(d, h0);
    st(d + 32, h1);
    st(d + 64, h2);
    st(d + 96, h3);
    st(d + n - 32, tail);
}

// Non-temporal forward copy for non-overlapping ranges, n > 256: 64-byte-aligned streaming
// stores of whole cache lines; the unaligned head and tail use ordinary stores. Because the
// ranges do not overlap, overlapping ordinary and streaming stores write identical bytes, so
// their order does not matter; one sfence at the end orders the streaming stores.
// The bulk goes in blocks of 4 x 4 KiB, taking one cache line from each of the 4 pages in
// turn: 4 concurrent streams per direction kept the memory controller busier than one
// (measured here, Xeon under KVM: 64 MiB 12.8-13.1 vs 11.9-12.0 GB/s for a linear loop,
// 256 MiB 9.0 vs 6.8; noisy machine, same ordering in repeated runs).
__attribute__((target("avx2"))) void copy_nt_fwd(u8* d, const u8* s, std::size_t n) {
    st(d, ld(s));
    st(d + 32, ld(s + 32));
    std::size_t i = (0u - reinterpret_cast<std::uintptr_t>(d)) & 63u;  // d + i 64-aligned
    constexpr std::size_t kPage = 4096, kBlock = 4 * kPage;
    for (; n - i >= kBlock; i += kBlock) {
        const u8* sp = s + i;
        u8* dp = d + i;
        for (std::size_t j = 0; j < kPage; j += 64) {
            __m256i a0 = ld(sp + j), a1 = ld(sp + j + 32);
            __m256i b0 = ld(sp + kPage + j), b1 = ld(sp + kPage + j + 32);
            __m256i c0 = ld(sp + 2 * kPage + j), c1 = ld(sp + 2 * kPage + j + 32);
            __m256i e0 = ld(sp + 3 * kPage + j), e1 = ld(sp + 3 * kPage + j + 32);
            stnt(dp + j, a0);
            stnt(dp + j + 32, a1);
            stnt(dp + kPage + j, b0);
            stnt(dp + kPage + j + 32, b1);
            stnt(dp + 2 * kPage + j, c0);
            stnt(dp + 2 * kPage + j + 32, c1);
            stnt(dp + 3 * kPage + j, e0);
            stnt(dp + 3 * kPage + j + 32, e1);
        }
    }
    for (; n - i >= 128; i += 128) {
        __m256i v0 = ld(s + i), v1 = ld(s + i + 32), v2 = ld(s + i + 64), v3 = ld(s + i + 96);
        stnt(d + i, v0);
        stnt(d + i + 32, v1);
        stnt(d + i + 64, v2);
        stnt(d + i + 96, v3);
    }
    if (n - i >= 64) {
        __m256i v0 = ld(s + i), v1 = ld(s + i + 32);
        stnt(d + i, v0);
        stnt(d + i + 32, v1);
    }
    __m256i t0 = ld(s + n - 64), t1 = ld(s + n - 32);
    st(d + n - 64, t0);
    st(d + n - 32, t1);
    _mm_sfence();
}

// Below this size streaming stores are a loss (a single cache line's round trip to memory).
constexpr std::size_t kNtMinBytes = 1024;

}  // namespace

__attribute__((target("avx2"))) void copy_avx2(void* dst, const void* src, std::size_t n) {
    auto* d = static_cast<u8*>(dst);
    auto* s = static_cast<const u8*>(src);
    if (n <= 256) {
        copy_small(d, s, n);
        return;
    }
    const std::uintptr_t diff = reinterpret_cast<std::uintptr_t>(d) - reinterpret_cast<std::uintptr_t>(s);
    if (diff == 0) return;
    // dst inside (src, src+n): backward is required. Everything else goes forward: measured
    // on an Intel Xeon (SPR-class, KVM) the backward loop ran 20-30 % slower from 64 KiB to
    // 1 MiB, and the forward loop showed no 4K-aliasing loss at (dst - src) mod 4096 = 16
    // (50 GB/s at 64 KiB, same as page-aligned), unlike `rep movsb` on Zen 3.
    if (diff < n) {
        copy_bwd(d, s, n);
        return;
    }
    copy_fwd(d, s, n);
}

__attribute__((target("avx2"))) void copy_avx2_nt(void* dst, const void* src, std::size_t n) {
    auto* d = static_cast<u8*>(dst);
    auto* s = static_cast<const u8*>(src);
    const std::uintptr_t diff = reinterpret_cast<std::uintptr_t>(d) - reinterpret_cast<std::uintptr_t>(s);
    // Overlapping ranges (either direction) and small copies take the cached path.
    if (n < kNtMinBytes || diff < n || 0u - diff < n) {
        copy_avx2(dst, src, n);
        return;
    }
    copy_nt_fwd(d, s, n);
}

}  // namespace fastcopy
