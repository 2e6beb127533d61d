// How the C library's malloc treats the large blocks of a process that receives large messages
// (fastcopy.net.keep_freed_memory). glibc serves a block of at least M_MMAP_THRESHOLD bytes
// with mmap and unmaps it when freed, so a process that allocates and frees a buffer of the same
// large size per message (Zenoh's buffers of a message in pieces, fastcopy.net's assembly)
// faults in and zeroes fresh pages for every message. glibc raises the threshold by itself only
// after a free of a block larger than the next request. Fixing the threshold (and the heap
// top kept at a trim, twice as much) makes such blocks come from the heap and be reused.
// evidence: net-keep-freed-memory
#pragma once
#include <cstddef>

namespace fastcopy {
namespace net {

// glibc's ceiling for M_MMAP_THRESHOLD on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX), the
// largest piece of any message in pieces and then some.
constexpr std::size_t kKeepFreedBytes = std::size_t(32) << 20;

// Blocks below `max_bytes` come from the heap, and up to 2 * max_bytes of freed memory at the
// heap's top stays for reuse. True when the C library took the setting (glibc); false
// elsewhere (another C library: nothing changes). std::invalid_argument unless 0 < max_bytes <=
// kKeepFreedBytes.
bool keep_freed_memory(std::size_t max_bytes);

}  // namespace net
}  // namespace fastcopy
