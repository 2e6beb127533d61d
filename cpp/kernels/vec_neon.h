// 16-byte ASIMD (NEON) vector trait for ops.h; ASIMD is part of every aarch64 CPU, so no
// target attribute is needed. NEON has no streaming kernel (no stream()): aarch64's STNP is
// only a hint, and no measurement here has shown it to pay.
#pragma once
#include <arm_neon.h>

#include "vec_scalar.h"

namespace fastcopy {
namespace vec {

struct Neon {
    using type = uint8x16_t;
    using Half = Word8;
    static constexpr std::size_t kWidth = 16;
    // Disjoint copies always go forward: the backward rule of the x86 traits (ops.h:
    // copies_backward_at_distance) was measured on x86 only.
    static constexpr std::size_t kBackwardBelowPageDistance = 0;
    // Head and tail moves up to 8 vectors (128 B); the loop above (not measured against 4).
    static constexpr std::size_t kSmallMaxVectors = 8;
    static constexpr bool kSplitSmallCopiesAtPages = false;  // not measured on ARM
    __attribute__((always_inline)) static inline type load(const unsigned char* p) { return vld1q_u8(p); }
    __attribute__((always_inline)) static inline void store(unsigned char* p, type v) { vst1q_u8(p, v); }
    // vst1q_u8 has no aligned form; ops.h still aligns the destination, which keeps every
    // store inside one cache line.
    __attribute__((always_inline)) static inline void store_aligned(unsigned char* p, type v) { vst1q_u8(p, v); }
};

}  // namespace vec
}  // namespace fastcopy
