// Copy kernels: one file per instruction set, each compiled with per-function target
// attributes (no global -march), so the module loads on any CPU of its architecture.
//
// Contract for every kernel: memmove semantics (overlapping ranges in either direction give
// the bytes memmove gives), and no byte outside [dst, dst+n) and [src, src+n) is read or
// written. A kernel may only be *called* on a CPU that supports it (see dispatch).
#pragma once
#include <cstddef>

namespace fastcopy {

using CopyFn = void (*)(void* dst, const void* src, std::size_t n);

// On every kernel definition: the function starts on a 64-byte line, so its branches and loops
// sit at the same offsets in every build (the module, kernel_bench, the tests). A kernel's speed
// at small sizes moves with that offset alone, and without the alignment the offset follows the
// size of unrelated code, since the module is linked whole with LTO (evidence:
// kernels-aligned-entry).
#define FASTCOPY_KERNEL_ALIGN __attribute__((aligned(64)))

// generic.cpp: the C library's memmove. Supported everywhere.
void copy_generic(void* dst, const void* src, std::size_t n);

#if defined(__x86_64__) || defined(_M_X64)
#define FASTCOPY_X86 1
// The AVX2, AVX-512 and NEON kernels are instances of the blocks in ops.h (vec_*.h traits).
// x86_avx2.cpp: 32-byte AVX2 loads/stores; overlapping head/tail moves for small sizes,
// aligned-store main loop. Needs AVX2.
void copy_avx2(void* dst, const void* src, std::size_t n);
// x86_avx2.cpp: same, main loop with non-temporal (streaming) stores and a final sfence.
// For large copies that would evict the caches. Needs AVX2.
void copy_avx2_nt(void* dst, const void* src, std::size_t n);
// x86_avx512.cpp: 64-byte AVX-512 loads/stores, same shape as copy_avx2 (head/tail moves
// below 512 B, aligned-store main loop, backward loop for overlap). Needs AVX-512 F+BW+VL.
void copy_avx512(void* dst, const void* src, std::size_t n);
// x86_avx512.cpp: same, disjoint copies from 1 KiB with non-temporal 64-byte stores and sfence.
void copy_avx512_nt(void* dst, const void* src, std::size_t n);
// x86_erms.cpp: `rep movsb`. Forward copies; falls back to memmove for dst inside
// (src, src+n). Needs ERMS to be fast (works on any x86_64).
void copy_erms(void* dst, const void* src, std::size_t n);
#endif

#if defined(__aarch64__)
#define FASTCOPY_ARM64 1
// arm_neon.cpp: 16-byte ASIMD loads/stores (always present on aarch64).
void copy_neon(void* dst, const void* src, std::size_t n);
// arm_sve.cpp: vector-length agnostic SVE loop with a predicated tail. Needs SVE.
void copy_sve(void* dst, const void* src, std::size_t n);
#endif

}  // namespace fastcopy
