// AVX-512 copy kernels: the ops.h blocks instantiated for 64-byte vectors (vec::Avx512).
// Per-function target attributes only (no global -march): the 512-bit instructions exist
// in these two functions and nowhere else, and they are only called where the registry's
// kNeedsAvx512 holds (CPUID F+BW+VL and XCR0 opmask/ZMM state, cpu.cpp).
//   avx512     n <= 256: overlapping head/tail size classes (64, then 32- and 16-byte halves
//              below 64 B), never touching a byte outside the ranges; above: 4 x 64-byte loop
//              with 64-byte-aligned stores, forward or backward (ops::memmove_cached).
//   avx512_nt  disjoint copies from 1 KiB: one non-temporal 64-byte store per cache line,
//              then sfence; smaller or overlapping copies as avx512 (ops::memmove_streaming).
// The same blocks run at width 64 in the C++ tests on every AVX2 machine (a test-only trait
// of two 32-byte halves), so only the thin intrinsics in vec_avx512.h need AVX-512 hardware.
#include "kernels.h"
#include "vec_avx512.h"

#define FASTCOPY_OPS_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))
#include "ops.h"

namespace fastcopy {

FASTCOPY_KERNEL_ALIGN FASTCOPY_OPS_TARGET void copy_avx512(void* dst, const void* src, std::size_t n) {
    ops::memmove_cached<vec::Avx512>(dst, src, n);
}

FASTCOPY_KERNEL_ALIGN FASTCOPY_OPS_TARGET void copy_avx512_nt(void* dst, const void* src, std::size_t n) {
    ops::memmove_streaming<vec::Avx512, copy_avx512>(dst, src, n);
}

}  // namespace fastcopy
