// 64-byte AVX-512 vector trait for ops.h. Only AVX-512F instructions (vmovdqu64, vmovdqa64,
// vmovntdq on zmm); the half step below it is the 32-byte AVX2 trait. The kernels built on
// it need AVX-512 F+BW+VL with the OS saving opmask and ZMM state (registry: kNeedsAvx512).
//
// vzeroupper: functions compiled with an AVX target get a vzeroupper before they return or
// call non-AVX code (GCC and clang insert it), so the dirty upper halves of the zmm
// registers never reach SSE code in the caller. The 512-bit instructions stay inside these
// kernels; nothing here changes what the rest of the program runs.
#pragma once
#include <immintrin.h>

#include "vec_avx2.h"

namespace fastcopy {
namespace vec {

#define FASTCOPY_VEC_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) static inline

struct Avx512 {
    using type = __m512i;
    using Half = Avx2;
    static constexpr std::size_t kWidth = 64;
    // As vec::Avx2, and as glibc's EVEX memmove: backward at (dst - src) mod 4096 in 1..255.
    static constexpr std::size_t kBackwardBelowPageDistance = 256;
    // Head and tail moves up to 4 vectors (256 B); from 257 B the aligned-store loop, or at a
    // 64-byte-aligned destination 4 + 4 head and tail moves up to 512 B (ops.h
    // four_to_eight_vectors). Eight overlapping unaligned 64-byte stores (glibc's shape up to
    // 512 B) ran 0.74-0.95x the loop at 257-512 B, medians over placements (evidence:
    // kernels-avx512-loop-from-256).
    static constexpr std::size_t kSmallMaxVectors = 4;
    // A store that straddles a 4 KiB page boundary costs several times a whole small copy on
    // the Intel CPU measured, whatever its width: disjoint copies of up to 8 vectors whose
    // destination crosses a page are made in two parts that meet at the boundary (ops.h
    // split_at_page; evidence: kernels-avx512-page-split-stores).
    static constexpr bool kSplitSmallCopiesAtPages = true;
    FASTCOPY_VEC_AVX512 type load(const unsigned char* p) { return _mm512_loadu_si512(p); }
    FASTCOPY_VEC_AVX512 void store(unsigned char* p, type v) { _mm512_storeu_si512(p, v); }
    // p must be 64-byte aligned (vmovdqa64 faults otherwise; ops.h aligns the destination).
    FASTCOPY_VEC_AVX512 void store_aligned(unsigned char* p, type v) { _mm512_store_si512(p, v); }
    // Non-temporal store of one whole cache line, p 64-byte aligned; ordered by fence().
    FASTCOPY_VEC_AVX512 void stream(unsigned char* p, type v) {
        _mm512_stream_si512(reinterpret_cast<__m512i*>(p), v);
    }
    FASTCOPY_VEC_AVX512 void fence() { _mm_sfence(); }
};

#undef FASTCOPY_VEC_AVX512

}  // namespace vec
}  // namespace fastcopy
