// The errors of the shared-memory layers. The Python binding maps them to
// fastcopy.shm.ChannelError and its subclasses (cpp/python/bindings_shm.cpp).
#pragma once
#include <cerrno>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace fastcopy {
namespace shm {

struct ShmError : std::runtime_error { using std::runtime_error::runtime_error; };
struct ShmCorrupted : ShmError { using ShmError::ShmError; };
struct ShmPeerDied : ShmError { using ShmError::ShmError; };
struct ShmClosed : ShmError { using ShmError::ShmError; };
struct ShmTimeout : ShmError { using ShmError::ShmError; };
// An operation on a Channel this process already closed (Python: ValueError, like files).
struct ShmUseAfterClose : ShmError { using ShmError::ShmError; };
// A bad name or size given to create/attach (Python: a ChannelError that is also a ValueError).
struct ShmBadArgument : ShmError { using ShmError::ShmError; };
// A signal handler raised while we waited (the Python exception is already set).
struct ShmInterrupted : ShmError { ShmInterrupted() : ShmError("interrupted") {} };
// An OS call failed; err is the errno (Python: OSError subclass from errno).
struct ShmOsError : ShmError {
    int err;
    ShmOsError(int e, const std::string& what) : ShmError(what), err(e) {}
};
// No room in /dev/shm for a segment: the preflight before a create, or ENOSPC from
// posix_fallocate (space taken between the two, or an attach). Python: fastcopy.shm.ShmSpaceError,
// an OSError with errno ENOSPC that is also a ChannelError, with needed/free/path attributes.
struct ShmNoSpace : ShmOsError {
    std::uint64_t needed, free;
    std::string path;
    ShmNoSpace(std::uint64_t n, std::uint64_t f, const std::string& p, const std::string& what)
        : ShmOsError(ENOSPC, what), needed(n), free(f), path(p) {}
};
// A subscriber's copy was overwritten in drop mode: `count` messages were skipped.
struct ShmMessagesLost : ShmError {
    std::uint64_t count;
    ShmMessagesLost(std::uint64_t n, const std::string& what) : ShmError(what), count(n) {}
};

}  // namespace shm
}  // namespace fastcopy
