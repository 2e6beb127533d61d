// The loop direction of ops::memmove_cached for disjoint copies: a 32-byte test vector that
// records where its aligned (loop) stores go, in order, under the page-distance rule of the
// AVX2 trait and under a trait without one (as vec::Neon).
#include "ops_direction.h"

#include <cstdint>
#include <cstring>

#include "kernels/vec_avx2.h"

namespace {

using u8 = unsigned char;

std::vector<std::size_t>* g_offsets = nullptr;
const u8* g_base = nullptr;

struct Bytes16 {
    u8 b[16];
};
struct Bytes32 {
    u8 b[32];
};

// Plain byte moves; store_aligned records the destination offset.
template <class T, class HalfT, std::size_t kBackwardBelow>
struct Recording {
    using type = T;
    using Half = HalfT;
    static constexpr std::size_t kWidth = sizeof(T);
    static constexpr std::size_t kBackwardBelowPageDistance = kBackwardBelow;
    static constexpr std::size_t kSmallMaxVectors = fastcopy::vec::Avx2::kSmallMaxVectors;
    static constexpr bool kSplitSmallCopiesAtPages = fastcopy::vec::Avx2::kSplitSmallCopiesAtPages;
    __attribute__((always_inline)) static inline T load(const u8* p) {
        T v;
        std::memcpy(&v, p, sizeof v);
        return v;
    }
    __attribute__((always_inline)) static inline void store(u8* p, T v) { std::memcpy(p, &v, sizeof v); }
    __attribute__((always_inline)) static inline void store_aligned(u8* p, T v) {
        if (g_offsets) g_offsets->push_back(static_cast<std::size_t>(p - g_base));
        std::memcpy(p, &v, sizeof v);
    }
};

using Half16 = Recording<Bytes16, fastcopy::vec::Word8, 0>;
using WithAvx2Rule = Recording<Bytes32, Half16, fastcopy::vec::Avx2::kBackwardBelowPageDistance>;
using NeverBackward = Recording<Bytes32, Half16, 0>;

}  // namespace

#define FASTCOPY_OPS_TARGET
#include "kernels/ops.h"

namespace fastcopy_test {

std::vector<std::size_t> loop_store_offsets(void* dst, const void* src, std::size_t n, bool avx2_rule) {
    std::vector<std::size_t> offsets;
    g_offsets = &offsets;
    g_base = static_cast<const u8*>(dst);
    if (avx2_rule) fastcopy::ops::memmove_cached<WithAvx2Rule>(dst, src, n);
    else fastcopy::ops::memmove_cached<NeverBackward>(dst, src, n);
    g_offsets = nullptr;
    return offsets;
}

}  // namespace fastcopy_test
