// Named shared-memory segments: see segment.h.
#include "shm/segment.h"

#include "core/read_only_ranges.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/read_only_ranges.h"
#include "shm/errors.h"
#include "shm/os.h"

namespace fastcopy {
namespace shm {

namespace {
std::string shm_path(const std::string& name) { return "/" + name; }
// Where shm_open's names live (glibc and musl on Linux).
const std::string kShmDir = "/dev/shm/";

// Makes sure every page of the file exists. Creating, this fails with ENOSPC on a full
// /dev/shm (Docker's default is 64 MiB) instead of a SIGBUS at the first write into a page
// tmpfs cannot supply. Attaching, a file that was truncated to its size but never allocated
// (a creator that skipped this, or a crafted file) would otherwise map fine and kill this
// process with SIGBUS at its first write. Pages that exist are left as they are. 0 or errno.
int allocate_pages(int fd, std::uint64_t bytes) {
    int fe = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    return fe == EOPNOTSUPP || fe == EINVAL ? 0 : fe;
}

// A size for messages: "100.0 MiB (104857600 bytes)".
std::string describe_bytes(std::uint64_t n) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f MiB (%llu bytes)", static_cast<double>(n) / (1 << 20),
                  static_cast<unsigned long long>(n));
    return buf;
}
}  // namespace

ShmSpace shm_space() {
    ShmSpace s;
    s.path = kShmDir.substr(0, kShmDir.size() - 1);
    struct statvfs v {};
    if (::statvfs(s.path.c_str(), &v) != 0) return s;
    s.total = static_cast<std::uint64_t>(v.f_blocks) * v.f_frsize;
    s.free = static_cast<std::uint64_t>(v.f_bavail) * v.f_frsize;
    s.ok = true;
    return s;
}

ShmNoSpace no_space(std::uint64_t bytes, const std::string& what) {
    const ShmSpace s = shm_space();
    // The suggested --shm-size: what is in use plus what is needed, rounded up to a power of two
    // of MiB, at least twice Docker's default 64 MiB.
    // Saturating: a size near 2**64 suggests the largest size, never wraps around.
    const std::uint64_t used = s.total > s.free ? s.total - s.free : 0;
    const std::uint64_t want = bytes > ~std::uint64_t(0) - used ? ~std::uint64_t(0) : used + bytes;
    std::uint64_t mib = 128;
    while (mib < (std::uint64_t(1) << 43) && (mib << 20) < want) mib *= 2;
    const std::string size = mib >= 1024 ? std::to_string(mib / 1024) + "g" : std::to_string(mib) + "m";
    std::string msg = what + ": it needs " + describe_bytes(bytes) + " of shared memory and " + s.path + " has ";
    msg += s.ok ? describe_bytes(s.free) + " free of " + describe_bytes(s.total) : std::string("an unknown amount free");
    msg += ". In Docker, give the container a larger " + s.path + " (docker run --shm-size=" + size +
           "); in Kubernetes, mount an emptyDir volume with medium: Memory at " + s.path +
           "; elsewhere, free space in " + s.path +
           " (python -m fastcopy shm --doctor lists stale segments, shm --clean removes them) or use smaller "
           "capacities";
    return ShmNoSpace(bytes, s.free, s.path, msg);
}

std::uint64_t preflight(std::uint64_t bytes, const std::string& what) {
    const ShmSpace s = shm_space();
    if (!s.ok) return 0;
    // Whole pages; a size within a page of 2**64 stays as it is (larger than any free space).
    const std::uint64_t need =
        bytes > ~std::uint64_t(0) - kPageBytes ? bytes : (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
    if (need > s.free) throw no_space(need, what);
    return s.free;
}

Mapping::~Mapping() {
    if (base) core::forget_read_only_ranges_in(base, bytes);
    if (base) ::munmap(base, bytes);
    if (fd >= 0) ::close(fd);
}

void release_segment(const MappedSegment& seg) {
    if (seg.base) core::forget_read_only_ranges_in(seg.base, seg.bytes);
    if (seg.base) ::munmap(seg.base, seg.bytes);
    if (seg.fd >= 0) ::close(seg.fd);
}

void check_segment_name(const std::string& name, const char* kind) {
    if (name.empty() || name.size() > 200 || name.find('/') != std::string::npos || name == "." || name == "..")
        throw ShmBadArgument(std::string("invalid ") + kind + " name '" + name +
                             "': use 1 to 200 characters without '/'");
    for (char c : name)
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
            throw ShmBadArgument(std::string("invalid ") + kind + " name: control characters are not allowed");
}

MappedSegment create_segment(const std::string& name, std::uint64_t bytes, const SegmentKind& kind,
                             const std::function<void(std::uint8_t*)>& init) {
    // A name that exists fails before anything is allocated; link() below decides for certain.
    if (::access((kShmDir + name).c_str(), F_OK) == 0)
        throw ShmOsError(EEXIST, "cannot create shared memory segment '" + name + "': " + std::strerror(EEXIST));
    // Room for every page before any is touched or the name exists: a clear error now instead
    // of a SIGBUS or an ENOSPC later.
    preflight(bytes, "cannot create shared memory segment '" + name + "'");
    // The segment is made and initialised under a name of its own, then linked to `name`, so that
    // an attach never finds `name` half made.
    static std::atomic<std::uint64_t> counter{0};
    const std::string temp = kCreatingPrefix + std::to_string(::getpid()) + "-" +
                             std::to_string(counter.fetch_add(1, std::memory_order_relaxed));
    const std::string temp_path = shm_path(temp);
    int fd = ::shm_open(temp_path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        int e = errno;
        throw ShmOsError(e, "cannot create shared memory segment '" + name + "': " + std::strerror(e));
    }
    remove_on_fatal_signal(temp);
    void* p = MAP_FAILED;
    auto fail = [&](int e, const std::string& what, bool full) {
        if (p != MAP_FAILED) ::munmap(p, bytes);
        if (fd >= 0) ::close(fd);
        ::shm_unlink(temp_path.c_str());
        keep_on_fatal_signal(temp);
        // ENOSPC here is space another process took after the preflight: the preflight's error,
        // saying so.
        if (e == ENOSPC)
            throw no_space(bytes, "cannot create shared memory segment '" + name +
                                      "' (the space was taken by another process after the check)");
        throw ShmOsError(e, what + (full ? " (is /dev/shm full or too small?): " : ": ") + std::strerror(e));
    };
    MappedSegment seg;
    struct stat st {};
    if (::fstat(fd, &st) != 0) fail(errno, "cannot stat shared memory segment '" + name + "'", false);
    seg.dev = static_cast<std::uint64_t>(st.st_dev);
    seg.ino = static_cast<std::uint64_t>(st.st_ino);
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0)
        fail(errno, "cannot size shared memory segment '" + name + "' to " + std::to_string(bytes) + " bytes", true);
    if (int fe = allocate_pages(fd, bytes))
        fail(fe, "cannot allocate " + std::to_string(bytes) + " bytes for shared memory segment '" + name + "'", true);
    p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | populate_flag(bytes), fd, 0);
    if (p == MAP_FAILED) fail(errno, "cannot map shared memory segment '" + name + "'", true);
    seg.base = static_cast<std::uint8_t*>(p);
    seg.bytes = bytes;
    // The file is zero-filled: the kind's words, then the prefix with the magic last.
    init(seg.base);
    store_release_u32(seg.base + kSegVersion, kind.version);
    store_release_u32(seg.base + kSegHeaderBytes, static_cast<std::uint32_t>(kHeaderBytes));
    const std::uint32_t me = static_cast<std::uint32_t>(::getpid());
    store_release_u32(seg.base + kSegCreatorPid, me);
    store_release_u64(seg.base + kSegCreatorStart, process_start_time(me));
    store_release_u64(seg.base + kSegMagic, kind.magic);
    // link() never replaces an existing name (EEXIST), as O_EXCL would not.
    if (::link((kShmDir + temp).c_str(), (kShmDir + name).c_str()) != 0)
        fail(errno, "cannot create shared memory segment '" + name + "'", false);
    remove_on_fatal_signal(name);
    ::shm_unlink(temp_path.c_str());
    keep_on_fatal_signal(temp);
    seg.fd = fd;  // kept for copy-on-write views (Mapping::fd)
    return seg;
}

MappedSegment open_segment(const std::string& name, std::uint64_t min_bytes, std::uint64_t max_bytes,
                           const SegmentKind& kind, const HeaderCheck& check) {
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
    // The header first, read from the file: a file that is not a segment of this kind is refused
    // before its pages are allocated (a large sparse file would fill /dev/shm, and a small
    // /dev/shm would say ENOSPC instead of what is wrong).
    {
        alignas(8) std::uint8_t header[kHeaderBytes];
        const ssize_t got = ::pread(fd, header, sizeof header, 0);
        std::string why;
        if (got != static_cast<ssize_t>(sizeof header)) {
            why = got < 0 ? std::string("cannot read its header: ") + std::strerror(errno) : "cannot read its header";
        } else if ((why = check_prefix(header, kind)).empty()) {
            why = check(header, size);
        }
        if (!why.empty()) {
            ::close(fd);
            throw ShmCorrupted("shared memory segment '" + name + "': " + why);
        }
    }
    if (int fe = allocate_pages(fd, size)) {
        ::close(fd);
        if (fe == ENOSPC) throw no_space(size, "cannot attach to shared memory segment '" + name + "'");
        throw ShmOsError(fe, "cannot allocate the " + std::to_string(size) + " bytes of shared memory segment '" +
                                 name + "' (is /dev/shm full or too small?): " + std::strerror(fe));
    }
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | populate_flag(size), fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        ::close(fd);
        throw ShmOsError(e, "cannot map shared memory segment '" + name + "': " + std::strerror(e));
    }
    MappedSegment seg;
    seg.fd = fd;  // kept for copy-on-write views (Mapping::fd)
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
    // Copies refuse a destination in these pages instead of faulting (core/read_only_ranges.h).
    core::set_read_only_range(base + data_offset, map_bytes - data_offset, read_only);
}

std::unique_ptr<Mapping> map_private_pages(const Mapping& seg, const std::uint8_t* p, std::size_t n,
                                           std::uint8_t*& at, const std::string& name) {
    static const long page_size = ::sysconf(_SC_PAGESIZE);
    const std::size_t page = page_size > 0 ? static_cast<std::size_t>(page_size) : kPageBytes;
    if (seg.fd < 0) throw ShmError("shared memory segment '" + name + "' keeps no file: no copy-on-write view");
    const std::size_t offset = static_cast<std::size_t>(p - seg.base);
    if (p < seg.base || n == 0 || offset > seg.bytes || n > seg.bytes - offset)
        throw ShmError("copy-on-write view outside its segment '" + name + "'");
    const std::size_t first = offset / page * page;
    const std::size_t end = (offset + n + page - 1) / page * page;
    void* m = ::mmap(nullptr, end - first, PROT_READ | PROT_WRITE, MAP_PRIVATE, seg.fd, static_cast<off_t>(first));
    if (m == MAP_FAILED) {
        int e = errno;
        throw ShmOsError(e, "cannot map a copy-on-write view of shared memory segment '" + name + "': " +
                                std::strerror(e));
    }
    at = static_cast<std::uint8_t*>(m) + (offset - first);
    return std::make_unique<Mapping>(static_cast<std::uint8_t*>(m), end - first);
}

}  // namespace shm
}  // namespace fastcopy
