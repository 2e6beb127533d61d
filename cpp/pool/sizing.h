// How many threads a parallel copy uses by default: the CPUs in the affinity mask, limited by
// the cgroup CPU quota along the process's cgroup path (rounded up), capped at
// kDefaultThreadsCap. Internal to the pool; pool.h has the public functions.
#pragma once

#include <string>

namespace fastcopy {
namespace pool {
namespace detail {

struct Sizing {
    unsigned cpus = 1;       // affinity mask (or hardware_concurrency)
    double quota = 0;        // cgroup CPU quota in CPUs, 0 = none
    std::string quota_src;   // file it came from
    unsigned result = 1;
};

// The sizing of this process as the system reports it now.
Sizing compute_sizing();

// Adds to `s` the smallest CPU quota along the cgroup path in `cgroup_text` (the contents of
// /proc/self/cgroup) under `mount` (where cgroups are mounted).
void cgroup_quota_from(const std::string& cgroup_text, const std::string& mount, Sizing& s);

}  // namespace detail
}  // namespace pool
}  // namespace fastcopy
