// The built-in profiles' tables as written (defaults.cpp) and what matching and resolving them
// needs to know of their shape (builtin_match.cpp). Internal to the policy.
#pragma once

#include <cstddef>
#include <vector>

#include "profile.h"

namespace fastcopy {
namespace policy {
namespace builtin {

constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;

// What a built-in profile requires of the CPU (besides its architecture).
enum MatchNeeds : unsigned { kMatchAvx2 = 1, kMatchAvx512 = 2, kMatchSve = 4, kMatchErms = 8 };

struct BandSpec {
    std::size_t from;
    const char* kernel;
    const char* fallback;  // used when `kernel` is not in this build or not usable on this CPU
    const char* why;
};
using ClassSpec = std::vector<BandSpec>;

// Inherit: only for Spec::shared_nt, the regions of shared memory use Spec::nt.
enum class NtKind { None, HalfL3Cap64M, HalfL3Cap12M, TwiceL3, Inherit };

struct RegionSpec {
    ClassSpec page_aligned, near, far, backward;
    std::size_t erms_on_request;  // SIZE_MAX: FASTCOPY_REP_MOVSB=on does not reach this region
    const char* erms_on_request_why;
};

struct Spec {
    const char* name;
    const char* arch;
    std::vector<const char*> vendors;  // empty: any
    int family;                        // -1: any
    int model_lo, model_hi;            // -1: any
    unsigned needs;                    // MatchNeeds
    Provenance provenance;
    RegionSpec regions[kRegions];
    NtKind nt;
    const char* nt_kernel;
    std::size_t nt_min_page_distance;  // NtRule::min_page_distance
    // NtRule::min_page_distance_below in the private region, where the pool splits large copies;
    // copies into and out of shared memory keep the guard at every size (one thread).
    std::size_t nt_min_page_distance_below = SIZE_MAX;
    // NtRule::learn_from in the private region (SIZE_MAX: off): where copies below the NT
    // threshold learn their store mode by timing themselves.
    std::size_t nt_learn_from = SIZE_MAX;
    // The NT rule of copies into and out of shared memory, when it differs from `nt`: a peer
    // process runs on the other CPUs there, so the pool cannot help the copy, and the peer
    // reads what was written. `shared_nt_why` says why.
    NtKind shared_nt = NtKind::Inherit;
    const char* shared_nt_why = nullptr;
    std::size_t parallel_from;
    const char* parallel_why;
    // ParallelRule::learn_from (SIZE_MAX: private copies on the pool always split).
    std::size_t split_learn_from = kMinSplitLearnFrom;
    // ParallelRule::shared_from (0: parallel_from).
    std::size_t parallel_shared_from = 0;
    std::size_t sve_trap_min_from;     // SVE bands start no lower than this on Linux 4.15..6.1 (0: no rule)
    std::vector<const char*> notes;
};

// Every built-in profile, most specific first among those of one architecture.
const std::vector<Spec>& specs();

}  // namespace builtin
}  // namespace policy
}  // namespace fastcopy
