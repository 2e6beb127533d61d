// Scalar "vectors" of 1, 2, 4 and 8 bytes: the bottom of every kernel's size-class ladder
// (ops.h copies n <= 16 bytes with two overlapping moves of these). memcpy of a fixed size
// compiles to one plain load or store and is free of alignment and aliasing traps.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace fastcopy {
namespace vec {

template <class T, class HalfT>
struct Word {
    using type = T;
    using Half = HalfT;  // the next smaller step of the ladder (void: none)
    static constexpr std::size_t kWidth = sizeof(T);
    __attribute__((always_inline)) static inline T load(const unsigned char* p) {
        T v;
        std::memcpy(&v, p, sizeof(T));
        return v;
    }
    __attribute__((always_inline)) static inline void store(unsigned char* p, T v) { std::memcpy(p, &v, sizeof(T)); }
};

using Word1 = Word<std::uint8_t, void>;
using Word2 = Word<std::uint16_t, Word1>;
using Word4 = Word<std::uint32_t, Word2>;
using Word8 = Word<std::uint64_t, Word4>;

}  // namespace vec
}  // namespace fastcopy
