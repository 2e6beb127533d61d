// The ops.h blocks at width 64 without AVX-512: a vector of two 32-byte AVX2 halves stands in
// for a zmm register. Same block code, same sizes, same alignment rules as x86_avx512.cpp, so
// the test body in test_kernels.cpp (every size 0..4096, misalignments, both overlap
// directions, guard pages, ASan/UBSan) covers all of the AVX-512 kernels except the thin
// intrinsics in vec_avx512.h.
#include "ops_width64.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/vec_avx2.h"
#include "kernels/vec_avx512.h"

namespace {

using u8 = unsigned char;

[[noreturn]] void misaligned(const char* what, const void* p) {
    std::fprintf(stderr, "ops_width64: %s at %p is not 64-byte aligned (a zmm store would fault)\n", what, p);
    std::abort();
}

#define WIDTH64_OP __attribute__((target("avx2"), always_inline)) static inline

std::size_t g_straddling = 0;  // 64-byte stores across a page boundary (page_straddling_stores)

WIDTH64_OP void count_straddle(const u8* p) {
    if ((reinterpret_cast<std::uintptr_t>(p) & 4095) > 4096 - 64) ++g_straddling;
}

struct Width64 {
    struct type {
        __m256i lo, hi;
    };
    using Half = fastcopy::vec::Avx2;  // as vec::Avx512
    static constexpr std::size_t kWidth = 64;
    static constexpr std::size_t kBackwardBelowPageDistance = fastcopy::vec::Avx512::kBackwardBelowPageDistance;
    static constexpr std::size_t kSmallMaxVectors = fastcopy::vec::Avx512::kSmallMaxVectors;
    static constexpr bool kSplitSmallCopiesAtPages = fastcopy::vec::Avx512::kSplitSmallCopiesAtPages;
    WIDTH64_OP type load(const u8* p) { return {Half::load(p), Half::load(p + 32)}; }
    WIDTH64_OP void store(u8* p, type v) {
        count_straddle(p);
        Half::store(p, v.lo);
        Half::store(p + 32, v.hi);
    }
    WIDTH64_OP void store_aligned(u8* p, type v) {
        if (reinterpret_cast<std::uintptr_t>(p) & 63) misaligned("aligned store", p);
        Half::store_aligned(p, v.lo);
        Half::store_aligned(p + 32, v.hi);
    }
    WIDTH64_OP void stream(u8* p, type v) {
        if (reinterpret_cast<std::uintptr_t>(p) & 63) misaligned("streaming store", p);
        Half::stream(p, v.lo);
        Half::stream(p + 32, v.hi);
    }
    WIDTH64_OP void fence() { Half::fence(); }
};

}  // namespace

#define FASTCOPY_OPS_TARGET __attribute__((target("avx2")))
#include "kernels/ops.h"

namespace fastcopy_test {

FASTCOPY_OPS_TARGET void copy_width64(void* dst, const void* src, std::size_t n) {
    fastcopy::ops::memmove_cached<Width64>(dst, src, n);
}

FASTCOPY_OPS_TARGET void copy_width64_nt(void* dst, const void* src, std::size_t n) {
    fastcopy::ops::memmove_streaming<Width64, copy_width64>(dst, src, n);
}

std::size_t width64_page_straddling_stores() {
    const std::size_t n = g_straddling;
    g_straddling = 0;
    return n;
}

}  // namespace fastcopy_test
