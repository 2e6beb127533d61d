// x86 vector traits for ops.h: 16-byte SSE2 (only as the half step below AVX2) and 32-byte
// AVX2. Each member carries its own target attribute, so including this header adds no
// AVX2 instruction to code that does not call it.
#pragma once
#include <immintrin.h>

#include "vec_scalar.h"

namespace fastcopy {
namespace vec {

#define FASTCOPY_VEC_SSE2 __attribute__((target("sse2"), always_inline)) static inline
#define FASTCOPY_VEC_AVX2 __attribute__((target("avx2"), always_inline)) static inline

struct Sse2 {
    using type = __m128i;
    using Half = Word8;
    static constexpr std::size_t kWidth = 16;
    FASTCOPY_VEC_SSE2 type load(const unsigned char* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
    FASTCOPY_VEC_SSE2 void store(unsigned char* p, type v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v); }
};

struct Avx2 {
    using type = __m256i;
    using Half = Sse2;
    static constexpr std::size_t kWidth = 32;
    // Disjoint copies at (dst - src) mod 4096 in 1..255 go backward (ops.h:
    // copies_backward_at_distance; evidence: kernels-backward-short-distance).
    static constexpr std::size_t kBackwardBelowPageDistance = 256;
    // Head and tail moves up to 8 vectors (256 B), as glibc's AVX2 memmove. AVX2 serves the
    // AMD profiles, where ending them at 4 vectors (as vec::Avx512 does) was not measured.
    static constexpr std::size_t kSmallMaxVectors = 8;
    // Copies across a page stay whole: the straddling-store cost behind vec::Avx512's split was
    // measured on Intel only, and this kernel serves the AMD profiles.
    static constexpr bool kSplitSmallCopiesAtPages = false;
    FASTCOPY_VEC_AVX2 type load(const unsigned char* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
    FASTCOPY_VEC_AVX2 void store(unsigned char* p, type v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
    // p must be 32-byte aligned (ops.h aligns the destination first).
    FASTCOPY_VEC_AVX2 void store_aligned(unsigned char* p, type v) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), v); }
    // Non-temporal store (vmovntdq), p 32-byte aligned; ordered by fence().
    FASTCOPY_VEC_AVX2 void stream(unsigned char* p, type v) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v); }
    FASTCOPY_VEC_AVX2 void fence() { _mm_sfence(); }
};

#undef FASTCOPY_VEC_SSE2
#undef FASTCOPY_VEC_AVX2

}  // namespace vec
}  // namespace fastcopy
