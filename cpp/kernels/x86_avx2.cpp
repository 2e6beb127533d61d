// AVX2 copy kernels: the ops.h blocks instantiated for 32-byte vectors (vec::Avx2).
// Compiled with per-function target attributes only, so this file adds no AVX2 instruction
// to code that runs on CPUs without it.
//   avx2     n <= 256: overlapping head/tail size classes; above: 4 x 32-byte loop with
//            32-byte-aligned stores, forward or backward (ops::memmove_cached).
//   avx2_nt  the same, but disjoint copies from 1 KiB use non-temporal 64-byte lines and an
//            sfence (ops::memmove_streaming).
#include "kernels.h"
#include "vec_avx2.h"

#define FASTCOPY_OPS_TARGET __attribute__((target("avx2")))
#include "ops.h"

namespace fastcopy {

FASTCOPY_KERNEL_ALIGN FASTCOPY_OPS_TARGET void copy_avx2(void* dst, const void* src, std::size_t n) {
    ops::memmove_cached<vec::Avx2>(dst, src, n);
}

FASTCOPY_KERNEL_ALIGN FASTCOPY_OPS_TARGET void copy_avx2_nt(void* dst, const void* src, std::size_t n) {
    ops::memmove_streaming<vec::Avx2, copy_avx2>(dst, src, n);
}

}  // namespace fastcopy
