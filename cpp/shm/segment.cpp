// Named shared-memory segments: see segment.h.
#include "shm/segment.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shm/errors.h"
#include "shm/os.h"

namespace fastcopy {
namespace shm {

namespace {
std::string shm_path(const std::string& name) { return "/" + name; }

// Makes sure every page of the file exists. Creating, this fails with ENOSPC on a full
// /dev/shm (Docker's default is 64 MiB) instead of a SIGBUS at the first write into a page
// tmpfs cannot supply. Attaching, a file that was truncated to its size but never allocated
// (a creator that skipped this, or a crafted file) would otherwise map fine and kill this
// process with SIGBUS at its first write. Pages that exist are left as they are. 0 or errno.
int allocate_pages(int fd, std::uint64_t bytes) {
    int fe = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    return fe == EOPNOTSUPP || fe == EINVAL ? 0 : fe;
}
}  // namespace

Mapping::~Mapping() {
    if (base) ::munmap(base, bytes);
}

void check_segment_name(const std::string& name, const char* kind) {
    if (name.empty() || name.size() > 200 || name.find('/') != std::string::npos || name == "." || name == "..")
        throw ShmBadArgument(std::string("invalid ") + kind + " name '" + name +
                             "': use 1 to 200 characters without '/'");
    for (char c : name)
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
            throw ShmBadArgument(std::string("invalid ") + kind + " name: control characters are not allowed");
}

MappedSegment create_segment(const std::string& name, std::uint64_t bytes) {
    const std::string path = shm_path(name);
    int fd = ::shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        int e = errno;
        throw ShmOsError(e, "cannot create shared memory segment '" + name + "': " + std::strerror(e));
    }
    auto fail = [&](int e, const std::string& what) {
        ::close(fd);
        ::shm_unlink(path.c_str());
        throw ShmOsError(e, what + " (is /dev/shm full or too small?): " + std::strerror(e));
    };
    MappedSegment seg;
    struct stat st {};
    if (::fstat(fd, &st) != 0) fail(errno, "cannot stat shared memory segment '" + name + "'");
    seg.dev = static_cast<std::uint64_t>(st.st_dev);
    seg.ino = static_cast<std::uint64_t>(st.st_ino);
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0)
        fail(errno, "cannot size shared memory segment '" + name + "' to " + std::to_string(bytes) + " bytes");
    if (int fe = allocate_pages(fd, bytes))
        fail(fe, "cannot allocate " + std::to_string(bytes) + " bytes for shared memory segment '" + name + "'");
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | populate_flag(bytes), fd, 0);
    if (p == MAP_FAILED) fail(errno, "cannot map shared memory segment '" + name + "'");
    ::close(fd);
    seg.base = static_cast<std::uint8_t*>(p);
    seg.bytes = bytes;
    remove_on_fatal_signal(name);
    return seg;
}

void publish_segment(std::uint8_t* base, const SegmentKind& kind) {
    store_release_u32(base + kSegVersion, kind.version);
    store_release_u32(base + kSegHeaderBytes, static_cast<std::uint32_t>(kHeaderBytes));
    const std::uint32_t me = static_cast<std::uint32_t>(::getpid());
    store_release_u32(base + kSegCreatorPid, me);
    store_release_u64(base + kSegCreatorStart, process_start_time(me));
    store_release_u64(base + kSegMagic, kind.magic);  // last: the segment is ready
}

MappedSegment open_segment(const std::string& name, std::uint64_t min_bytes, std::uint64_t max_bytes,
                           const SegmentKind& kind) {
    const std::string path = shm_path(name);
    int fd = ::shm_open(path.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        throw ShmOsError(e, "cannot open shared memory segment '" + name + "': " + std::strerror(e));
    }
    struct stat st;
    if (::fstat(fd, &st) != 0) {
        int e = errno;
        ::close(fd);
        throw ShmOsError(e, "cannot stat shared memory segment '" + name + "': " + std::strerror(e));
    }
    const std::uint64_t size = static_cast<std::uint64_t>(st.st_size);
    if (size < min_bytes || size > max_bytes) {
        ::close(fd);
        throw ShmCorrupted("shared memory segment '" + name + "' has " + std::to_string(size) +
                           " bytes, which is not the size of a fastcopy " + kind.noun);
    }
    if (int fe = allocate_pages(fd, size)) {
        ::close(fd);
        throw ShmOsError(fe, "cannot allocate the " + std::to_string(size) + " bytes of shared memory segment '" +
                                 name + "' (is /dev/shm full or too small?): " + std::strerror(fe));
    }
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | populate_flag(size), fd, 0);
    int e = errno;
    ::close(fd);
    if (p == MAP_FAILED)
        throw ShmOsError(e, "cannot map shared memory segment '" + name + "': " + std::strerror(e));
    MappedSegment seg;
    seg.base = static_cast<std::uint8_t*>(p);
    seg.bytes = size;
    seg.dev = static_cast<std::uint64_t>(st.st_dev);
    seg.ino = static_cast<std::uint64_t>(st.st_ino);
    return seg;
}

std::string check_prefix(const std::uint8_t* base, const SegmentKind& kind) {
    const std::uint64_t magic = load_acquire_u64(base + kSegMagic);
    const std::uint32_t version = load_acquire_u32(base + kSegVersion);
    const std::uint32_t hb = load_acquire_u32(base + kSegHeaderBytes);
    if (magic != kind.magic) return std::string("bad magic (not a fastcopy ") + kind.noun + ", or not initialised yet)";
    if (version != kind.version)
        return "protocol version " + std::to_string(version) + ", this build speaks " + std::to_string(kind.version);
    if (hb != kHeaderBytes) return "header size " + std::to_string(hb);
    return "";
}

bool unlink_segment(const std::string& name) {
    keep_on_fatal_signal(name);
    if (::shm_unlink(shm_path(name).c_str()) != 0) {
        int e = errno;
        if (e == ENOENT) return false;
        throw ShmOsError(e, "cannot unlink shared memory segment '" + name + "': " + std::strerror(e));
    }
    return true;
}

int populate_flag(std::uint64_t bytes) { return bytes <= (std::uint64_t(256) << 20) ? MAP_POPULATE : 0; }

void protect_data(std::uint8_t* base, std::size_t data_offset, std::size_t map_bytes, bool read_only,
                  const std::string& name) {
    static const long page = ::sysconf(_SC_PAGESIZE);
    if (page <= 0 || data_offset % static_cast<std::size_t>(page) != 0 || data_offset >= map_bytes) return;
    const int prot = read_only ? PROT_READ : PROT_READ | PROT_WRITE;
    if (::mprotect(base + data_offset, map_bytes - data_offset, prot) != 0) {
        int e = errno;
        throw ShmOsError(e, "cannot map the data of shared memory segment '" + name + "' " +
                                (read_only ? "read-only" : "writable") + ": " + std::strerror(e));
    }
}

}  // namespace shm
}  // namespace fastcopy
