// `rep movsb` kernel. Runs on every x86_64 CPU; fast with ERMS (and FSRM for short copies).
// `rep movsb` copies forward (direction flag clear, as the ABI guarantees at calls), which
// gives memmove's result whenever dst is not inside (src, src+n). For dst inside that
// window a backward copy is required: that case goes to the C library's memmove.
// Note: `rep movsb` slows down badly when (dst - src) mod 4096 is 1..31 on some CPUs
// (4K aliasing in the microcode's fast path); the dispatcher avoids this kernel there.
#include <cstdint>
#include <cstring>

#include "kernels.h"

namespace fastcopy {

FASTCOPY_KERNEL_ALIGN void copy_erms(void* dst, const void* src, std::size_t n) {
    if (n == 0) return;
    const std::uintptr_t diff =
        reinterpret_cast<std::uintptr_t>(dst) - reinterpret_cast<std::uintptr_t>(src);
    if (diff == 0) return;
    if (diff < n) {  // dst inside (src, src+n): needs a backward copy
        std::memmove(dst, src, n);
        return;
    }
    void* d = dst;
    const void* s = src;
    std::size_t c = n;
    asm volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(c) : : "memory");
}

}  // namespace fastcopy
