// Large-copy bandwidth and pool hand-off benchmark (results: docs/evidence/pool.md).
//
// In one run, with the variants interleaved round by round (the order rotates each round),
// it measures GB/s (bytes copied / time, each byte counted once) for:
//   memcpy       glibc memcpy, one thread
//   K            each streaming kernel K of the registry this CPU supports (avx2_nt, ...), one thread
//   pool:memcpy  the pool, each chunk by memcpy       (threads: --threads, default 2)
//   pool:K       the pool, each chunk by streaming kernel K
//   copy_bytes   fastcopy::copy_bytes, the full policy
// at 1, 4, 16, 64, 256 MiB, and prints median, min and max per variant and the best
// variant per size (by median). Then the pool hand-off cost (ping(): an empty job round
// trip through a running worker, spinning and sleeping), and a threshold sweep (64 KiB to
// 16 MiB: memcpy alone vs the pool) with the ratio of medians.
//
//   bandwidth [--rounds=N] [--threads=N] [--sizes=1,4,16] (MiB) [--no-sweep] [--quick]
//             [--no-adaptive]   (pool: no back-off after late workers; see pool.h)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/dispatch.h"
#include "kernels/kernels.h"
#include "kernels/registry.h"
#include "pool/pool.h"

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#endif

using namespace fastcopy;

namespace {

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

unsigned char* alloc_pages(std::size_t n) {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, n) != 0) {
        std::perror("posix_memalign");
        std::exit(1);
    }
    std::memset(p, 1, n);  // fault the pages in
    return static_cast<unsigned char*>(p);
}

void libc_memcpy(void* d, const void* s, std::size_t n) { std::memcpy(d, s, n); }
void pool_memcpy(void* d, const void* s, std::size_t n) { pool::parallel_copy(d, s, n, libc_memcpy); }
void policy_copy(void* d, const void* s, std::size_t n) { copy_bytes(d, s, n); }

struct Variant {
    std::string name;
    std::function<void(void*, const void*, std::size_t)> fn;
};

Variant pooled(const std::string& name, CopyFn fn) {
    return {"pool:" + name, [fn](void* d, const void* s, std::size_t n) { pool::parallel_copy(d, s, n, fn); }};
}

struct Stat {
    double median = 0, min = 0, max = 0;
};
Stat summarize(std::vector<double> v) {
    Stat s;
    if (v.empty()) return s;
    std::sort(v.begin(), v.end());
    const std::size_t m = v.size();
    s.median = m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
    s.min = v.front();
    s.max = v.back();
    return s;
}

// Copies needed per sample so that one sample lasts about `target_s`.
int reps_for(const std::function<void(void*, const void*, std::size_t)>& fn, unsigned char* d, const unsigned char* s, std::size_t n, double target_s) {
    fn(d, s, n);
    const double t0 = now_s();
    fn(d, s, n);
    const double t = std::max(now_s() - t0, 1e-7);
    return std::max(1, int(target_s / t));
}

// GB/s samples for every variant at size n; interleaved, rotating order.
std::vector<std::vector<double>> measure(const std::vector<Variant>& vs, unsigned char* dst,
                                         const unsigned char* src, std::size_t n, int rounds,
                                         double target_s) {
    std::vector<int> reps(vs.size());
    for (std::size_t i = 0; i < vs.size(); ++i) reps[i] = reps_for(vs[i].fn, dst, src, n, target_s);
    std::vector<std::vector<double>> gbs(vs.size());
    for (int r = 0; r < rounds; ++r)
        for (std::size_t k = 0; k < vs.size(); ++k) {
            const std::size_t i = (k + std::size_t(r)) % vs.size();
            const double t0 = now_s();
            for (int j = 0; j < reps[i]; ++j) vs[i].fn(dst, src, n);
            const double t = now_s() - t0;
            gbs[i].push_back(double(n) * reps[i] / t / 1e9);
        }
    return gbs;
}

std::string size_str(std::size_t n) {
    char b[32];
    if (n >= (1u << 20)) std::snprintf(b, sizeof b, "%zu MiB", n >> 20);
    else std::snprintf(b, sizeof b, "%zu KiB", n >> 10);
    return b;
}

void handoff(int samples) {
    // Spinning worker: pings back to back keep it inside its spin window.
    std::vector<double> ns;
    for (int i = 0; i < 200; ++i) pool::ping();
    for (int i = 0; i < samples; ++i) {
        const double t0 = now_s();
        const bool ok = pool::ping();
        const double t = now_s() - t0;
        if (ok) ns.push_back(t * 1e9);
    }
    const Stat a = summarize(ns);
    // Sleeping worker: wait past the spin window first, so the hand-off includes a futex wake.
    std::vector<double> ns2;
    for (int i = 0; i < samples / 20 + 5; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        const double t0 = now_s();
        const bool ok = pool::ping();
        const double t = now_s() - t0;
        if (ok) ns2.push_back(t * 1e9);
    }
    const Stat b = summarize(ns2);
    std::printf("\nPool hand-off (round trip of an empty job through one running worker, ns):\n");
    std::printf("  worker spinning : median %8.0f  min %8.0f  max %8.0f  (%zu samples)\n",
                a.median, a.min, a.max, ns.size());
    std::printf("  worker asleep   : median %8.0f  min %8.0f  max %8.0f  (%zu samples, futex wake)\n",
                b.median, b.min, b.max, ns2.size());
}

}  // namespace

int main(int argc, char** argv) {
    int rounds = 11;
    unsigned threads = 2;
    bool sweep = true, quick = false;
    std::vector<std::size_t> sizes_mib = {1, 4, 16, 64, 256};
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a.rfind("--rounds=", 0) == 0) rounds = std::max(1, std::atoi(a.c_str() + 9));
        else if (a.rfind("--threads=", 0) == 0) threads = unsigned(std::max(1, std::atoi(a.c_str() + 10)));
        else if (a == "--no-sweep") sweep = false;
        else if (a == "--no-adaptive") pool::set_adaptive(false);
        else if (a == "--quick") quick = true;
        else if (a.rfind("--sizes=", 0) == 0) {
            sizes_mib.clear();
            const char* p = a.c_str() + 8;
            while (*p) {
                sizes_mib.push_back(std::strtoul(p, const_cast<char**>(&p), 10));
                if (*p == ',') ++p;
            }
        } else {
            std::fprintf(stderr, "usage: %s [--rounds=N] [--threads=N] [--sizes=1,4,16] "
                                 "[--no-sweep] [--no-adaptive] [--quick]\n", argv[0]);
            return 2;
        }
    }
    if (quick) rounds = std::min(rounds, 5);
    try {
        init_policy();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "init_policy: %s\n", e.what());
        return 1;
    }
    pool::set_threads(threads);

    // The registry's streaming kernels this CPU supports, and the cache-friendly twin of the
    // first one (for the threshold sweep).
    std::vector<const KernelInfo*> streaming;
    const KernelInfo* cached = nullptr;
    for (const KernelEntry& e : kernel_registry()) {
        const KernelInfo* k = find_kernel(e.name);
        if (!e.streaming || !k || !k->supported) continue;
        streaming.push_back(k);
        if (!cached && e.twin) cached = find_kernel(e.twin);
    }
    std::vector<Variant> vs = {{"memcpy", libc_memcpy}};
    for (const KernelInfo* k : streaming) vs.push_back({k->name, k->fn});
    vs.push_back({"pool:memcpy", pool_memcpy});
    for (const KernelInfo* k : streaming) vs.push_back(pooled(k->name, k->fn));
    vs.push_back({"copy_bytes", policy_copy});

    const std::size_t max_n = *std::max_element(sizes_mib.begin(), sizes_mib.end()) << 20;
    unsigned char* src = alloc_pages(max_n);
    unsigned char* dst = alloc_pages(max_n);
    for (std::size_t i = 0; i < max_n; i += 4096) src[i] = static_cast<unsigned char>(i >> 12);

    std::printf("fastcopy bandwidth: GB/s (1e9 bytes/s, bytes counted once), %d interleaved "
                "rounds, pool threads %s, page-aligned buffers\n",
                rounds, pool::threads_reason().c_str());
    std::printf("policy: parallel from %zu bytes, non-temporal from %zu bytes\n",
                parallel_threshold(), nt_threshold());
    std::printf("\n%-8s %-13s %8s %8s %8s %7s\n", "size", "variant", "median", "min", "max",
                "vs memcpy");
    for (std::size_t mib : sizes_mib) {
        const std::size_t n = mib << 20;
        const auto gbs = measure(vs, dst, src, n, rounds, quick ? 0.005 : 0.02);
        std::vector<Stat> st;
        for (auto& g : gbs) st.push_back(summarize(g));
        std::size_t best = 0;
        for (std::size_t i = 0; i < st.size(); ++i) {
            std::printf("%-8s %-13s %8.2f %8.2f %8.2f %6.2fx\n", i == 0 ? size_str(n).c_str() : "",
                        vs[i].name.c_str(), st[i].median, st[i].min, st[i].max,
                        st[i].median / st[0].median);
            // Best single technique: copy_bytes is the policy, not a technique.
            if (vs[i].name != "copy_bytes" && st[i].median > st[best].median) best = i;
        }
        std::printf("%-8s best technique: %s (%.2f GB/s); copy_bytes chose %s%s\n", "",
                    vs[best].name.c_str(), st[best].median,
                    n >= parallel_threshold() ? "parallel " : "",
                    kernel_name(choose_kernel(dst, src, n, Region::Private)));
    }

    handoff(quick ? 2000 : 20000);

    if (sweep) {
        // Where 2+ threads start paying off: memcpy alone vs the pool, same buffers.
        std::vector<Variant> tv = {{"memcpy", libc_memcpy}, {"pool:memcpy", pool_memcpy}};
        if (cached) {
            tv.push_back({cached->name, cached->fn});
            tv.push_back(pooled(cached->name, cached->fn));
        }
        // Many short samples; the ratio is taken per round (pool and alone measured next to
        // each other), so load from other processes that drifts over the run cancels out.
        const int sr = std::max(31, rounds * 4 + 1);
        std::printf("\nThreshold sweep, hot (back-to-back copies; GB/s medians of %d interleaved "
                    "rounds; ratio = median over rounds of pool / same kernel alone, with its "
                    "quartiles):\n", sr);
        std::printf("%-8s %8s %11s %17s", "size", "memcpy", "pool:memcpy", "ratio [q1 q3]");
        if (tv.size() > 2)
            std::printf(" %8s %9s %17s", tv[2].name.c_str(), tv[3].name.c_str(), "ratio [q1 q3]");
        std::printf("\n");
        auto quartiles = [](std::vector<double> v, double& q1, double& q2, double& q3) {
            std::sort(v.begin(), v.end());
            const std::size_t m = v.size();
            q1 = v[m / 4];
            q2 = v[m / 2];
            q3 = v[(3 * m) / 4];
        };
        for (std::size_t n = 64u << 10; n <= (16u << 20) && n <= max_n; n *= 2) {
            const auto gbs = measure(tv, dst, src, n, sr, quick ? 0.0005 : 0.001);
            std::vector<Stat> st;
            for (auto& g : gbs) st.push_back(summarize(g));
            std::printf("%-8s %8.2f %11.2f", size_str(n).c_str(), st[0].median, st[1].median);
            for (std::size_t k = 0; k + 1 < tv.size(); k += 2) {
                if (k) std::printf(" %8.2f %9.2f", st[k].median, st[k + 1].median);
                std::vector<double> ratio;
                for (std::size_t r = 0; r < gbs[k].size(); ++r) ratio.push_back(gbs[k + 1][r] / gbs[k][r]);
                double q1, q2, q3;
                quartiles(ratio, q1, q2, q3);
                std::printf("  %5.2fx [%4.2f %4.2f]", q2, q1, q3);
            }
            std::printf("\n");
        }
    }
    if (sweep) {
        // Isolated copies: 1 ms of idleness before each, so the worker has gone to sleep and
        // the copy pays a futex wake-up (what a Python caller with gaps between copies sees).
        std::printf("\nIsolated copies (1 ms idle before each; worker asleep; us per copy, "
                    "medians of %d):\n", rounds * 3);
        std::printf("%-8s %9s %12s %6s\n", "size", "memcpy", "pool:memcpy", "ratio");
        for (std::size_t n = 256u << 10; n <= (16u << 20) && n <= max_n; n *= 2) {
            std::vector<double> a, b;
            for (int r = 0; r < rounds * 3; ++r)
                for (int v = 0; v < 2; ++v) {
                    std::this_thread::sleep_for(std::chrono::milliseconds(1));
                    const int which = (v + r) % 2;
                    const double t0 = now_s();
                    if (which == 0) libc_memcpy(dst, src, n);
                    else pool_memcpy(dst, src, n);
                    (which == 0 ? a : b).push_back((now_s() - t0) * 1e6);
                }
            const Stat sa = summarize(a), sb = summarize(b);
            std::printf("%-8s %9.1f %12.1f %5.2fx\n", size_str(n).c_str(), sa.median, sb.median,
                        sa.median / sb.median);
        }
    }
    const auto s = pool::stats();
    std::printf("\npool: %llu parallel copies, %llu chunks by workers, %llu late workers, "
                "%llu copies alone during back-off, %llu alone while the workers slept\n",
                (unsigned long long)s.parallel_copies, (unsigned long long)s.chunks_by_workers,
                (unsigned long long)s.late_events, (unsigned long long)s.backoff_fallbacks,
                (unsigned long long)s.asleep_fallbacks);
    std::free(src);
    std::free(dst);
    return 0;
}
