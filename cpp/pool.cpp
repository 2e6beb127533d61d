// TEMPORARY single-threaded pool until the real pool lands.
#include "pool.h"
namespace fastcopy { namespace pool {
unsigned threads() { return 1; }
unsigned default_threads() { return 1; }
std::string threads_reason() { return "temporary single-threaded pool"; }
void set_threads(unsigned) {}
void parallel_copy(void* dst, const void* src, std::size_t n, CopyFn kernel) { kernel(dst, src, n); }
}}
