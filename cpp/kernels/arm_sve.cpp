// SVE copy kernel, vector-length agnostic: a predicated loop (svwhilelt) handles every size,
// including 0 and the partial last vector, without touching a byte outside the ranges
// (inactive lanes of predicated loads/stores never access memory or fault).
// Only the functions in this file are compiled for SVE (target pragma), so nothing else in
// the build contains SVE instructions; callers must check for SVE first (dispatch does).
#include "kernels.h"

#pragma GCC push_options
#pragma GCC target("+sve")
#include <arm_sve.h>

#include <cstdint>

namespace fastcopy {
namespace {

using u8 = unsigned char;

// dst <= src or disjoint: ascending, two vectors per iteration, predicated remainder.
void sve_fwd(u8* d, const u8* s, std::uint64_t n) {
    const std::uint64_t vl = svcntb();
    std::uint64_t i = 0;
    if (n >= 2 * vl) {
        const svbool_t all = svptrue_b8();
        for (; i + 2 * vl <= n; i += 2 * vl) {
            svuint8_t a = svld1_u8(all, s + i);
            svuint8_t b = svld1_u8(all, s + i + vl);
            svst1_u8(all, d + i, a);
            svst1_u8(all, d + i + vl, b);
        }
    }
    for (; i < n; i += vl) {
        const svbool_t pg = svwhilelt_b8_u64(i, n);
        svst1_u8(pg, d + i, svld1_u8(pg, s + i));
    }
}

// dst inside (src, src+n): descending whole vectors from the top, then the predicated
// remainder at the bottom. Each vector is loaded before it is stored, and every later load
// lies below every earlier store's source window, so overlap is handled.
void sve_bwd(u8* d, const u8* s, std::uint64_t n) {
    const std::uint64_t vl = svcntb();
    const svbool_t all = svptrue_b8();
    std::uint64_t k = n;
    while (k >= 2 * vl) {
        k -= 2 * vl;
        svuint8_t b = svld1_u8(all, s + k + vl);
        svuint8_t a = svld1_u8(all, s + k);
        svst1_u8(all, d + k + vl, b);
        svst1_u8(all, d + k, a);
    }
    if (k >= vl) {
        k -= vl;
        svst1_u8(all, d + k, svld1_u8(all, s + k));
    }
    if (k > 0) {
        const svbool_t pg = svwhilelt_b8_u64(0, k);
        svst1_u8(pg, d, svld1_u8(pg, s));
    }
}

}  // namespace

FASTCOPY_KERNEL_ALIGN void copy_sve(void* dst, const void* src, std::size_t n) {
    auto* d = static_cast<u8*>(dst);
    auto* s = static_cast<const u8*>(src);
    const std::uintptr_t diff = reinterpret_cast<std::uintptr_t>(d) - reinterpret_cast<std::uintptr_t>(s);
    if (n == 0 || diff == 0) return;
    if (diff < n)
        sve_bwd(d, s, n);
    else
        sve_fwd(d, s, n);
}

}  // namespace fastcopy
#pragma GCC pop_options
