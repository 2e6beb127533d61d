// Test-only probe of the loop direction of ops::memmove_cached (ops_direction.cpp).
#pragma once
#include <cstddef>
#include <vector>

namespace fastcopy_test {

// Copies n bytes (memmove semantics) with the ops.h blocks at width 32 and returns the
// destination offsets of the loop's aligned stores in the order they were made: increasing
// for the forward loop, decreasing for the backward one. avx2_rule: the trait carries
// vec::Avx2's page-distance rule; otherwise none (as vec::Neon).
std::vector<std::size_t> loop_store_offsets(void* dst, const void* src, std::size_t n, bool avx2_rule);

}  // namespace fastcopy_test
