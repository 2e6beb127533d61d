// A named POSIX shared-memory segment (/dev/shm/<name>), as Channel and Topic use it: create,
// attach, map, unlink; and the prefix every segment's header starts with.
//
// The prefix (the first bytes of the 4096-byte header of every segment, Channel or Topic):
//   +0     magic (u64): what kind of segment, written last by the creator (release)
//   +8     version (u32): the kind's protocol version
//   +12    header_bytes (u32): kHeaderBytes
//   +1408  creator pid (u32), +1416 creator start time (u64): `python -m fastcopy shm --clean`
//          removes segments whose creator is gone
// Each kind defines its own words in the rest of the header (channel.h, topic.h), around
// these offsets; static_asserts there keep them apart.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "shm/errors.h"

namespace fastcopy {
namespace shm {

// One page: the data of a segment starts on a page, so a reader maps it read-only and the
// header writable (protect_data).
constexpr std::size_t kHeaderBytes = 4096;
constexpr std::size_t kPageBytes = 4096;
// A segment is made under "<kCreatingPrefix><pid>-<n>" and linked to its name once initialised;
// a process killed (SIGKILL) in between leaves that name, which `shm --clean` removes once the
// pid is gone.
constexpr const char* kCreatingPrefix = ".fastcopy-new-";
static_assert(kHeaderBytes % kPageBytes == 0, "the data starts on a page (protect_data)");

enum SegmentOff : std::size_t {
    kSegMagic = 0, kSegVersion = 8, kSegHeaderBytes = 12,
    kSegCreatorPid = 1408, kSegCreatorStart = 1416,
};
// True when [off, off + width) overlaps none of the prefix's words: for the static_asserts of
// the kinds' own offsets.
constexpr bool outside_prefix(std::size_t off, std::size_t width) {
    return off >= 16 && (off + width <= kSegCreatorPid || off >= kSegCreatorStart + 8) && off + width <= kHeaderBytes;
}

// What a segment is, for its header and for error messages.
struct SegmentKind {
    const char* noun;        // "channel", "topic"
    std::uint64_t magic;
    std::uint32_t version;
};

// The mapping of a segment. Shared by the Channel or Topic end and by every loaned array and
// received view, so that memory a Python array points into stays mapped until the last such
// array is gone, even after the end was closed. fd: the segment's file (close-on-exec), kept
// open for copy-on-write views (map_private_pages), also after the name was unlinked; -1 for
// a mapping that is not a whole segment.
struct Mapping {
    std::uint8_t* base;
    std::size_t bytes;
    int fd;
    Mapping(std::uint8_t* b, std::size_t n, int file = -1) : base(b), bytes(n), fd(file) {}
    ~Mapping();
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
};

// A segment this process mapped (read-write, the whole file). fd: the file, open; whoever
// takes the segment hands it to its Mapping (or closes it with release_segment on failure).
struct MappedSegment {
    std::uint8_t* base = nullptr;
    std::size_t bytes = 0;
    int fd = -1;
    std::uint64_t dev = 0, ino = 0;  // identity of the file
};
// Unmaps the segment and closes its file (an attach that found it invalid).
void release_segment(const MappedSegment& seg);

// ShmBadArgument unless `name` can name a segment in /dev/shm; `kind` ("channel", "topic") is
// named in the message.
void check_segment_name(const std::string& name, const char* kind);

// Creates /dev/shm/<name> of `bytes` bytes, with its pages allocated, and maps it. The
// segment is made under a temporary name, zero-filled; init(base) writes the kind's own header
// words, the prefix follows with the magic last (release), and only then is the segment linked
// to `name`: whoever opens `name` finds it whole. An existing name is never replaced
// (ShmOsError EEXIST). The free space is checked first (preflight: ShmNoSpace before anything
// is created); ENOSPC from posix_fallocate is the same ShmNoSpace. Registers the name for removal on a fatal signal.
MappedSegment create_segment(const std::string& name, std::uint64_t bytes, const SegmentKind& kind,
                             const std::function<void(std::uint8_t*)>& init);

// Why the header (the first kHeaderBytes of a segment of `size` bytes, whose prefix is the
// kind's) does not describe this segment ("" when it does): the kind's own words.
using HeaderCheck = std::function<std::string(const std::uint8_t* header, std::uint64_t size)>;

// Opens and maps /dev/shm/<name> when its size is in [min_bytes, max_bytes] and its header,
// read from the file before anything is allocated or mapped, passes check_prefix and `check`
// (ShmCorrupted otherwise, naming kind.noun); then allocates its pages. The caller checks the
// mapped header again (it may have changed meanwhile) and unmaps on failure.
MappedSegment open_segment(const std::string& name, std::uint64_t min_bytes, std::uint64_t max_bytes,
                           const SegmentKind& kind, const HeaderCheck& check);
// Why the prefix at base is not the kind's ("" when it is): magic, version, header size.
std::string check_prefix(const std::uint8_t* base, const SegmentKind& kind);

// shm_unlink(name); false when it was already gone, ShmOsError on another failure.
bool unlink_segment(const std::string& name);

// The filesystem that holds the segments: its path and, from statvfs, its size and the bytes an
// unprivileged process may still allocate there (f_bavail). ok is false when statvfs fails.
struct ShmSpace {
    std::string path;
    std::uint64_t total = 0, free = 0;
    bool ok = false;
};
ShmSpace shm_space();
// The preflight of every create_segment, and of a caller about to create several segments (the
// sum of their sizes): ShmNoSpace unless `bytes`, rounded up to whole pages (tmpfs allocates
// pages), fit in the free space of /dev/shm now. Nothing is created or touched. Returns the free
// bytes; when statvfs fails it returns 0 and lets posix_fallocate decide.
std::uint64_t preflight(std::uint64_t bytes, const std::string& what);
// The ShmNoSpace for `bytes` that do not fit, `what` first: the bytes needed and free, the path,
// and the fixes (docker run --shm-size with a suggested size, a Kubernetes emptyDir in memory).
ShmNoSpace no_space(std::uint64_t bytes, const std::string& what);

// MAP_POPULATE for segments up to 256 MiB, 0 above: the first pass over the data takes no
// page faults (costs about 1 ms per MiB at create/attach).
int populate_flag(std::uint64_t bytes);
// Sets the protection of the data of a segment mapped at `base` (`map_bytes` long): the bytes
// from `data_offset` (page-aligned) to the end become read-only (a consumer's or a
// subscriber's mapping: a write through a view, e.g. with ctypes, faults in the writing process
// instead of changing what the other processes read) or writable again (a producer's). The
// control words before data_offset stay writable. On a system whose pages are larger than the
// 4096 bytes the layouts align to, the data stays writable. ShmOsError when mprotect fails.
void protect_data(std::uint8_t* base, std::size_t data_offset, std::size_t map_bytes, bool read_only,
                  const std::string& name);

// A copy-on-write view's memory: the pages of the segment's file (seg.fd) that cover
// [p, p + n) (p inside seg), mapped MAP_PRIVATE and writable. Until a page is written it reads
// the segment's bytes (the caller keeps the slot held so that those do not change); a write
// copies only the page written, into this process's private memory, so the segment never
// changes. `at` is p's address in the returned mapping, which unmaps when destroyed. n > 0.
// Works at any offset of p: the mapping starts at the page below it. ShmOsError when mmap
// fails, ShmError when seg keeps no file.
std::unique_ptr<Mapping> map_private_pages(const Mapping& seg, const std::uint8_t* p, std::size_t n,
                                           std::uint8_t*& at, const std::string& name);

}  // namespace shm
}  // namespace fastcopy
