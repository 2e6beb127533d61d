// TEMPORARY placeholder until the AVX2 kernels land (same contract via memmove).
#include <cstring>
#include "kernels.h"
namespace fastcopy {
void copy_avx2(void* d, const void* s, std::size_t n) { if (n) std::memmove(d, s, n); }
void copy_avx2_nt(void* d, const void* s, std::size_t n) { if (n) std::memmove(d, s, n); }
}
