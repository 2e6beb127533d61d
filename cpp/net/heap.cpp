// See heap.h.
#include "net/heap.h"

#include <stdexcept>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace fastcopy {
namespace net {

bool keep_freed_memory(std::size_t max_bytes) {
    if (max_bytes == 0 || max_bytes > kKeepFreedBytes)
        throw std::invalid_argument("keep_freed_memory: max_bytes must be 1 to " + std::to_string(kKeepFreedBytes) +
                                    " (glibc's ceiling for its mmap threshold), got " + std::to_string(max_bytes));
#if defined(__GLIBC__)
    return mallopt(M_MMAP_THRESHOLD, static_cast<int>(max_bytes)) == 1 &&
           mallopt(M_TRIM_THRESHOLD, static_cast<int>(2 * max_bytes)) == 1;
#else
    (void)max_bytes;
    return false;
#endif
}

}  // namespace net
}  // namespace fastcopy
