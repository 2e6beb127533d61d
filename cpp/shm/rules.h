// The size and time rules of Channel and Topic: each value is defined here once, and rules()
// says in words what each does and the measurement behind it, with the values this process
// runs with (fastcopy.info()["shm"]).
#pragma once
#include <cstddef>
#include <vector>

namespace fastcopy {
namespace shm {

// Channel loans, and Topic slots of slot_bytes, from this payload size start their payload on
// a 4096-byte boundary; a Channel loan from this size also wraps early (channel.h).
// evidence: shm-page-aligned-loans, shm-early-wrap
constexpr std::size_t kPageAlignedLoanMin = 256 * 1024;
// send() and recv() of Channel and Topic copy a payload from this size with the GIL released.
// Not copy()'s threshold (kCopyReleaseGilBytes, cpp/python/copy_gil.h): see rules().
// evidence: shm-release-gil
constexpr std::size_t kShmReleaseGilBytes = 256 * 1024;
// Channel messages from this size are published in chunks of kPublishChunk while they are
// written. evidence: shm-pipelined-send
constexpr std::size_t kPipelineBytes = 512 * 1024;
constexpr std::size_t kPublishChunk = 256 * 1024;

struct ShmRule {
    const char* name;   // "page_aligned_loan_bytes", ...
    double value;       // bytes or seconds, as `unit` says
    const char* unit;   // "bytes" or "seconds"
    const char* rule;   // what happens at and above the value
    const char* why;    // the measurement behind it
};
std::vector<ShmRule> rules();

}  // namespace shm
}  // namespace fastcopy
