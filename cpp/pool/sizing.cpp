// The default thread count of the pool: affinity mask, cgroup CPU quota, cap (sizing.h).
#include "pool/sizing.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "pool/pool.h"

#if defined(__linux__)
#include <sched.h>
#endif

namespace fastcopy {
namespace pool {
namespace detail {
namespace {

bool read_file(const std::string& path, std::string& out) {
    std::ifstream f(path);
    if (!f) return false;
    std::stringstream ss;
    ss << f.rdbuf();
    out = ss.str();
    return true;
}

}  // namespace

#if defined(__linux__)
namespace {
// Quota from one cgroup v2 cpu.max ("max 100000" or "150000 100000"); 0 = no limit.
double quota_v2(const std::string& path) {
    std::string text;
    if (!read_file(path, text)) return -1;
    std::istringstream in(text);
    std::string q;
    long long period = 0;
    in >> q >> period;
    if (q == "max" || q.empty() || period <= 0) return 0;
    const long long quota = std::atoll(q.c_str());
    return quota > 0 ? double(quota) / double(period) : 0;
}

double quota_v1(const std::string& dir) {
    std::string qs, ps;
    if (!read_file(dir + "/cpu.cfs_quota_us", qs) || !read_file(dir + "/cpu.cfs_period_us", ps))
        return -1;
    const long long q = std::atoll(qs.c_str()), p = std::atoll(ps.c_str());
    return (q > 0 && p > 0) ? double(q) / double(p) : 0;
}

}  // namespace

// Smallest quota along the process's cgroup path (a parent's quota limits the children).
void cgroup_quota_from(const std::string& text, const std::string& mount, Sizing& s) {
    std::istringstream lines(text);
    std::string line, v2_path, v1_path;
    bool have_v1 = false, have_v2 = false;
    while (std::getline(lines, line)) {
        // "hierarchy-ID:controller-list:path"
        const auto a = line.find(':');
        const auto b = a == std::string::npos ? a : line.find(':', a + 1);
        if (b == std::string::npos) continue;
        const std::string ctrls = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
        if (line.compare(0, a, "0") == 0 && ctrls.empty()) {
            v2_path = path;
            have_v2 = true;
            continue;
        }
        std::istringstream cl(ctrls);
        std::string c;
        while (std::getline(cl, c, ','))
            if (c == "cpu") {
                v1_path = path;
                have_v1 = true;
            }
    }
    auto consider = [&](double q, const std::string& src) {
        if (q > 0 && (s.quota == 0 || q < s.quota)) {
            s.quota = q;
            s.quota_src = src;
        }
    };
    auto walk = [&](const std::string& root, std::string path, bool v2) {
        // From the process's own cgroup up to the root of the mount. Inside a container
        // the path in /proc/self/cgroup may not exist under the mount: the root then
        // is the container's own cgroup, checked last anyway.
        for (;;) {
            const std::string dir = root + (path == "/" ? "" : path);
            const std::string file = v2 ? dir + "/cpu.max" : dir + "/cpu.cfs_quota_us";
            consider(v2 ? quota_v2(dir + "/cpu.max") : quota_v1(dir), file);
            if (path.empty() || path == "/") break;
            const auto slash = path.rfind('/');
            path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
        }
    };
    if (have_v1) {
        for (const char* sub : {"/cpu,cpuacct", "/cpuacct,cpu", "/cpu"}) {
            std::string probe;
            if (read_file(mount + sub + "/cpu.cfs_period_us", probe)) {
                walk(mount + sub, v1_path, false);
                break;
            }
        }
    }
    if (have_v2) {
        std::string probe;
        if (read_file(mount + "/cgroup.controllers", probe))
            walk(mount, v2_path, true);
        else if (read_file(mount + "/unified/cgroup.controllers", probe))
            walk(mount + "/unified", v2_path, true);
    }
}

namespace {
void cgroup_quota(Sizing& s) {
    std::string text;
    if (read_file("/proc/self/cgroup", text)) cgroup_quota_from(text, "/sys/fs/cgroup", s);
}
}  // namespace
#endif

Sizing compute_sizing() {
    Sizing s;
#if defined(__linux__)
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        const int c = CPU_COUNT(&set);
        s.cpus = c > 0 ? unsigned(c) : 1;
    } else {
        const unsigned hc = std::thread::hardware_concurrency();
        s.cpus = hc ? hc : 1;
    }
    cgroup_quota(s);
#else
    const unsigned hc = std::thread::hardware_concurrency();
    s.cpus = hc ? hc : 1;
#endif
    unsigned n = s.cpus;
    if (s.quota > 0) {
        // Round up (as Go and the JVM do): 1.5 CPUs of quota gives 2 threads.
        unsigned q = unsigned(s.quota);
        if (double(q) < s.quota) ++q;
        n = std::min(n, std::max(1u, q));
    }
    s.result = std::max(1u, std::min(n, kDefaultThreadsCap));
    return s;
}

}  // namespace detail

double cgroup_cpu_quota(const std::string& cgroup_text, const std::string& mount_root,
                        std::string* source) {
    detail::Sizing s;
#if defined(__linux__)
    detail::cgroup_quota_from(cgroup_text, mount_root, s);
#else
    (void)cgroup_text;
    (void)mount_root;
#endif
    if (source) *source = s.quota_src;
    return s.quota;
}

}  // namespace pool
}  // namespace fastcopy
