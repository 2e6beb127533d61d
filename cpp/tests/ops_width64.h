// Test-only instances of the ops.h blocks at widths no CPU here has natively (ops_width64.cpp).
#pragma once
#include <cstddef>

namespace fastcopy_test {

// The AVX-512 kernels' logic (ops.h at width 64, 256-byte small classes, 64-byte-aligned
// main loop, streaming lines) on a test-only 64-byte vector made of two AVX2 halves; its
// aligned and streaming stores abort unless the address is 64-byte aligned, as vmovdqa64 and
// vmovntdq on zmm would fault. Call only where AVX2 is usable.
void copy_width64(void* dst, const void* src, std::size_t n);
void copy_width64_nt(void* dst, const void* src, std::size_t n);

// 64-byte stores of the two functions above that straddled a 4 KiB page boundary since the
// last call (which resets the count).
std::size_t width64_page_straddling_stores();

}  // namespace fastcopy_test
