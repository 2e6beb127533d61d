// ASIMD (NEON) copy kernel: the ops.h blocks instantiated for 16-byte vectors (vec::Neon),
// present on every aarch64 CPU.
//   n <= 128 : overlapping head/tail size classes; all loads before any store.
//   n >  128 : head and tail kept in registers, a 4 x 16-byte loop with 16-byte-aligned stores
//              runs forward (dst <= src or disjoint) or backward (dst inside (src, src+n)).
// No access leaves [src, src+n) / [dst, dst+n).
#include "kernels.h"
#include "vec_neon.h"

#define FASTCOPY_OPS_TARGET
#include "ops.h"

namespace fastcopy {

FASTCOPY_KERNEL_ALIGN void copy_neon(void* dst, const void* src, std::size_t n) { ops::memmove_cached<vec::Neon>(dst, src, n); }

}  // namespace fastcopy
