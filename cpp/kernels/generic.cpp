// The C library's memmove: the reference kernel, supported on every CPU.
#include <cstring>

#include "kernels.h"

namespace fastcopy {

FASTCOPY_KERNEL_ALIGN void copy_generic(void* dst, const void* src, std::size_t n) {
    if (n != 0) std::memmove(dst, src, n);
}

}  // namespace fastcopy
