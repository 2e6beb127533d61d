// Tests for the worker pool (cpp/pool/pool.cpp): chunk boundaries, odd sizes and misalignments,
// many concurrent callers, set_threads while copies run, fork after the pool started, the
// overlap fallback, sizing, and that an idle pool burns no CPU. Runs under ThreadSanitizer
// (.ci/tsan.sh). ctest name: pool_tests.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu.h"
#include "kernels/kernels.h"
#include "kernels/registry.h"
#include "pool/pool.h"

#if defined(__unix__) || defined(__APPLE__)
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#define HAVE_FORK 1
#endif

#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif

#if defined(UNDER_TSAN)
// The fork test starts threads in a child forked from a multi-threaded parent, which is
// what the pool does after fork; TSan refuses that unless told otherwise.
extern "C" const char* __tsan_default_options() { return "die_after_fork=0"; }
#endif

using namespace fastcopy;

namespace {

std::atomic<int> g_failures{0};

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            g_failures.fetch_add(1);                                            \
            std::fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            std::fprintf(stderr, __VA_ARGS__);                                  \
            std::fprintf(stderr, "\n");                                         \
        }                                                                       \
    } while (0)

// Fills with a pattern that differs per byte and per seed.
void fill(unsigned char* p, std::size_t n, std::uint32_t seed) {
    std::uint32_t x = seed * 2654435761u + 1;
    for (std::size_t i = 0; i < n; ++i) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = static_cast<unsigned char>(x);
    }
}

// A kernel that checks chunk boundaries: every chunk starts at the start of the copy or at a
// 64-byte-aligned dst address, and ends at the end of the copy or at an aligned address.
std::atomic<std::uintptr_t> g_copy_dst{0}, g_copy_end{0};
std::atomic<long> g_bad_bounds{0}, g_kernel_calls{0};
void checking_kernel(void* dst, const void* src, std::size_t n) {
    const auto d = reinterpret_cast<std::uintptr_t>(dst);
    const bool start_ok = d == g_copy_dst.load() || d % 64 == 0;
    const bool end_ok = d + n == g_copy_end.load() || (d + n) % 64 == 0;
    if (!start_ok || !end_ok || n == 0) g_bad_bounds.fetch_add(1);
    g_kernel_calls.fetch_add(1);
    std::memcpy(dst, src, n);
}

// Copies with the pool and checks the bytes and the guard zones around dst.
bool copy_and_check(std::size_t n, std::size_t src_off, std::size_t dst_off, CopyFn kernel,
                    std::size_t chunk, std::uint32_t seed, const char* what) {
    constexpr std::size_t kGuard = 128;
    std::vector<unsigned char> sbuf(n + 256), dbuf(n + 256 + 2 * kGuard), expect;
    unsigned char* src = sbuf.data() + src_off;
    unsigned char* dst = dbuf.data() + kGuard + dst_off;
    fill(sbuf.data(), sbuf.size(), seed);
    std::memset(dbuf.data(), 0xA5, dbuf.size());
    expect = dbuf;
    std::memcpy(expect.data() + kGuard + dst_off, src, n);
    if (chunk)
        pool::parallel_copy_chunked(dst, src, n, kernel, chunk);
    else
        pool::parallel_copy(dst, src, n, kernel);
    if (dbuf != expect) {
        std::size_t i = 0;
        while (dbuf[i] == expect[i]) ++i;
        CHECK(false, "%s: n=%zu src_off=%zu dst_off=%zu chunk=%zu: first bad byte at %zd",
              what, n, src_off, dst_off, chunk, std::ptrdiff_t(i) - std::ptrdiff_t(kGuard + dst_off));
        return false;
    }
    return true;
}

void test_boundaries() {
    pool::set_threads(4);
    const std::size_t sizes[] = {0,   1,   2,   63,  64,  65,   127,  128,  129,  191,
                                 192, 193, 255, 256, 257, 1000, 4095, 4096, 4097, 12345,
                                 65535, 65536, 65537, 100003};
    const std::size_t chunks[] = {64, 128, 192, 1000, 4096};
    const std::size_t offs[] = {0, 1, 7, 31, 32, 63};
    int cases = 0;
    for (std::size_t n : sizes)
        for (std::size_t chunk : chunks)
            for (std::size_t so : offs)
                for (std::size_t d : offs) {
                    // Keep the slow sanitizer run short: all offsets for small sizes only.
                    if (n > 5000 && (so % 2 != d % 2)) continue;
                    copy_and_check(n, so, d, copy_generic, chunk, std::uint32_t(n + so + d),
                                   "boundaries/generic");
                    ++cases;
                }
    // Boundary placement, with a kernel that checks every chunk it is given.
    for (std::size_t n : sizes)
        for (std::size_t chunk : chunks)
            for (std::size_t d : offs) {
                std::vector<unsigned char> src(n + 64), dst(n + 128);
                fill(src.data(), src.size(), 7);
                unsigned char* dp = dst.data() + d;
                g_copy_dst = reinterpret_cast<std::uintptr_t>(dp);
                g_copy_end = reinterpret_cast<std::uintptr_t>(dp) + n;
                g_bad_bounds = 0;
                g_kernel_calls = 0;
                pool::parallel_copy_chunked(dp, src.data() + 3, n, checking_kernel, chunk);
                CHECK(g_bad_bounds == 0, "chunk bounds not 64-byte aligned: n=%zu chunk=%zu d=%zu",
                      n, chunk, d);
                CHECK(n == 0 || std::memcmp(dp, src.data() + 3, n) == 0, "checking kernel copy n=%zu", n);
                // Enough work for >1 chunk must be cut into >1 chunk.
                if (n >= d + 3 * 64 + 2 * chunk)
                    CHECK(g_kernel_calls > 1, "n=%zu chunk=%zu not split (%ld calls)", n, chunk,
                          g_kernel_calls.load());
                ++cases;
            }
    // The default chunking, large sizes, odd sizes, every kernel this CPU runs.
    std::vector<std::pair<CopyFn, const char*>> kernels;
    const unsigned have = cpu_features(cpu_facts());
    for (const KernelEntry& e : kernel_registry())
        if ((e.needs & ~have) == 0) kernels.push_back({e.fn, e.name});
    const std::size_t big[] = {(1u << 20) - 1, (1u << 20) + 17, (3u << 20) + 4093, 8u << 20};
    for (auto& k : kernels)
        for (std::size_t n : big)
            for (std::size_t so : {0, 5})
                for (std::size_t d : {0, 33}) {
                    copy_and_check(n, so, d, k.first, 0, std::uint32_t(n ^ so ^ d), k.second);
                    ++cases;
                }
    std::printf("boundaries: %d cases\n", cases);
}

void test_overlap_fallback() {
    pool::set_threads(2);
    std::vector<unsigned char> buf(1 << 20), ref;
    for (std::ptrdiff_t shift : {1, 64, 4096, -1, -64, -4096}) {
        fill(buf.data(), buf.size(), 99);
        ref = buf;
        const std::size_t n = buf.size() - 8192;
        unsigned char* src = buf.data() + 4096;
        unsigned char* dst = src + shift;
        std::memmove(ref.data() + 4096 + shift, ref.data() + 4096, n);
        pool::parallel_copy_chunked(dst, src, n, copy_generic, 64);
        CHECK(buf == ref, "overlapping copy shift=%td differs from memmove", shift);
    }
}

// parallel_for: every index runs exactly once, workers take a share, concurrent callers and
// threads() == 1 still run every item; a batch of copy tasks gives the right bytes.
struct ForCtx {
    std::vector<std::atomic<int>>* hits;
    std::atomic<long>* on_other_threads;
    std::thread::id caller;
};
void count_item(void* ctx, std::size_t i) {
    auto* c = static_cast<ForCtx*>(ctx);
    (*c->hits)[i].fetch_add(1);
    if (std::this_thread::get_id() != c->caller) c->on_other_threads->fetch_add(1);
    // A little work per item so that workers get a share.
    volatile unsigned x = 0;
    for (int k = 0; k < 2000; ++k) x = x + k;
}
struct Task {
    unsigned char* dst;
    const unsigned char* src;
    std::size_t n;
};
void copy_task(void* ctx, std::size_t i) {
    const Task& t = static_cast<const Task*>(ctx)[i];
    std::memcpy(t.dst, t.src, t.n);
}
void test_parallel_for() {
    for (unsigned threads : {1u, 2u, 4u}) {
        pool::set_threads(threads);
        for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(2), std::size_t(7), std::size_t(1000)}) {
            std::vector<std::atomic<int>> hits(n);
            for (auto& h : hits) h.store(0);
            std::atomic<long> other{0};
            ForCtx ctx{&hits, &other, std::this_thread::get_id()};
            pool::parallel_for(n, count_item, &ctx);
            int bad = 0;
            for (auto& h : hits) bad += h.load() != 1;
            CHECK(bad == 0, "parallel_for threads=%u n=%zu: %d items not run exactly once", threads, n, bad);
            if (threads == 1) CHECK(other.load() == 0, "threads=1 but %ld items ran on a worker", other.load());
        }
    }
    // Workers really take items (n large enough that the caller cannot finish first).
    pool::set_threads(2);
    std::atomic<long> other{0};
    for (int round = 0; round < 20 && other.load() == 0; ++round) {
        std::vector<std::atomic<int>> hits(4000);
        for (auto& h : hits) h.store(0);
        ForCtx ctx{&hits, &other, std::this_thread::get_id()};
        pool::parallel_for(hits.size(), count_item, &ctx);
    }
    CHECK(other.load() > 0, "parallel_for never ran an item on a worker");
    // A batch of copies of odd sizes into one destination, from several callers at once.
    std::atomic<int> wrong{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
        ts.emplace_back([t, &wrong] {
            std::mt19937 rng(t + 11);
            for (int iter = 0; iter < 10; ++iter) {
                const std::size_t ntasks = 1 + rng() % 300;
                std::vector<std::size_t> sizes(ntasks);
                std::size_t total = 0;
                for (auto& sz : sizes) total += (sz = rng() % 5000);
                std::vector<unsigned char> src(total + 1), dst(total + 1, 0xA5), expect(total + 1, 0xA5);
                fill(src.data(), src.size(), std::uint32_t(rng()));
                std::vector<Task> tasks;
                std::size_t off = 0;
                for (std::size_t k = 0; k < ntasks; ++k) {
                    tasks.push_back({dst.data() + off, src.data() + off, sizes[k]});
                    off += sizes[k];
                }
                std::memcpy(expect.data(), src.data(), total);
                pool::parallel_for(tasks.size(), copy_task, tasks.data());
                if (dst != expect) wrong.fetch_add(1);
            }
        });
    for (auto& th : ts) th.join();
    CHECK(wrong.load() == 0, "%d batched copies wrong", wrong.load());
}

void test_concurrent_callers() {
    pool::set_threads(2);
    constexpr int kThreads = 8;
    const int iters = 40;
    std::vector<std::thread> ts;
    std::atomic<int> bad{0};
    const auto before = pool::stats();
    for (int t = 0; t < kThreads; ++t)
        ts.emplace_back([t, iters, &bad] {
            std::mt19937 rng(t * 7919 + 1);
            for (int i = 0; i < iters; ++i) {
                const std::size_t n = 1 + rng() % (600 * 1024);
                const std::size_t so = rng() % 64, d = rng() % 64;
                const std::size_t chunk = (i % 3 == 0) ? 0 : 64 * (1 + rng() % 64);
                if (!copy_and_check(n, so, d, copy_generic, chunk, std::uint32_t(rng()),
                                    "concurrent"))
                    bad.fetch_add(1);
            }
        });
    for (auto& th : ts) th.join();
    const auto after = pool::stats();
    CHECK(bad == 0, "%d concurrent copies wrong", bad.load());
    std::printf("concurrent: %d callers x %d copies: %llu used the pool, %llu copied alone "
                "(pool busy)\n",
                kThreads, iters,
                (unsigned long long)(after.parallel_copies - before.parallel_copies),
                (unsigned long long)(after.busy_fallbacks - before.busy_fallbacks));
}

void test_set_threads_during_copies() {
    std::atomic<bool> stop{false};
    std::atomic<int> bad{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 3; ++t)
        ts.emplace_back([t, &stop, &bad] {
            std::mt19937 rng(t + 100);
            int i = 0;
            while (!stop.load() || i < 10) {
                const std::size_t n = 1 + rng() % (300 * 1024);
                if (!copy_and_check(n, rng() % 64, rng() % 64, copy_generic,
                                    64 * (1 + rng() % 32), std::uint32_t(rng()), "set_threads"))
                    bad.fetch_add(1);
                ++i;
            }
        });
    const unsigned seq[] = {1, 4, 2, 0, 3, 1, 8, 2, 5, 0};
    for (int round = 0; round < 3; ++round)
        for (unsigned n : seq) {
            pool::set_threads(n);
            (void)pool::threads_reason();
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
    stop = true;
    for (auto& th : ts) th.join();
    CHECK(bad == 0, "%d copies wrong while set_threads changed", bad.load());
    pool::set_threads(3);
    copy_and_check(1 << 20, 0, 0, copy_generic, 0, 5, "after resize");
    CHECK(pool::started_workers() == 2, "3 threads -> 2 workers, have %u", pool::started_workers());
    pool::set_threads(1);
    copy_and_check(1 << 20, 0, 0, copy_generic, 0, 6, "threads=1");
    CHECK(!pool::ping(), "ping must refuse with threads()==1");
}

void test_sizing() {
    pool::set_threads(0);
    pool::set_env_threads(0);
    const unsigned d = pool::default_threads();
    CHECK(d >= 1 && d <= pool::kDefaultThreadsCap, "default_threads()=%u", d);
    CHECK(pool::threads() == d, "threads()=%u default=%u", pool::threads(), d);
    std::printf("sizing: %s\n", pool::threads_reason().c_str());
    pool::set_env_threads(3);
    CHECK(pool::threads() == 3, "env layer: %u", pool::threads());
    CHECK(pool::threads_reason().find("FASTCOPY_THREADS") != std::string::npos, "reason: %s",
          pool::threads_reason().c_str());
    pool::set_threads(5);
    CHECK(pool::threads() == 5, "set_threads over env: %u", pool::threads());
    pool::set_threads(0);
    CHECK(pool::threads() == 3, "set_threads(0) back to env: %u", pool::threads());
    pool::set_env_threads(0);
    CHECK(pool::threads() == d, "back to default: %u", pool::threads());
    pool::set_threads(100000);
    CHECK(pool::threads() == pool::kMaxThreads, "clamp: %u", pool::threads());
    pool::set_threads(0);
}

// A worker that is descheduled while it holds a chunk makes the caller wait; the pool then
// copies alone for a while (adaptive back-off).
std::thread::id g_caller_id;
void slow_on_worker_kernel(void* dst, const void* src, std::size_t n) {
    if (std::this_thread::get_id() != g_caller_id)
        std::this_thread::sleep_for(std::chrono::milliseconds(3));
    std::memcpy(dst, src, n);
}

void test_adaptive_backoff() {
    pool::set_threads(2);
    pool::set_adaptive(true);
    g_caller_id = std::this_thread::get_id();
    std::vector<unsigned char> src(4 << 20), dst(4 << 20);
    fill(src.data(), src.size(), 3);
    const auto s0 = pool::stats();
    // The worker must get a chunk to be late; on a loaded machine it may not run for a
    // while, so keep trying (up to 5 s). Then the very next copy must run alone (unless
    // this thread itself was descheduled past the 1 ms back-off: try again).
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    bool late = false, backed_off = false;
    while (!backed_off && std::chrono::steady_clock::now() < until) {
        const auto l0 = pool::stats().late_events;
        pool::parallel_copy_chunked(dst.data(), src.data(), src.size(), slow_on_worker_kernel,
                                    64 << 10);
        if (pool::stats().late_events == l0) continue;
        late = true;
        const auto b0 = pool::stats().backoff_fallbacks;
        pool::parallel_copy_chunked(dst.data(), src.data(), src.size(), copy_generic, 64 << 10);
        backed_off = pool::stats().backoff_fallbacks > b0;
    }
    const auto s1 = pool::stats();
    std::printf("adaptive: %llu late workers, %llu copies alone during back-off\n",
                (unsigned long long)(s1.late_events - s0.late_events),
                (unsigned long long)(s1.backoff_fallbacks - s0.backoff_fallbacks));
    CHECK(late, "a 3 ms stall on a worker was not noticed");
    CHECK(backed_off, "no back-off after a late worker");
    CHECK(src == dst, "copy during back-off");
    std::this_thread::sleep_for(std::chrono::milliseconds(250));  // past the longest back-off
    const auto s3 = pool::stats();
    pool::parallel_copy_chunked(dst.data(), src.data(), src.size(), copy_generic, 64 << 10);
    CHECK(pool::stats().parallel_copies > s3.parallel_copies, "back-off did not end");
    pool::set_adaptive(false);
}

#if defined(__linux__)
// Fake cgroup trees under a temporary directory: v2 nested quotas, v2 path missing inside a
// container, v1 with a quota below the root, no quota.
void write_file(const std::string& path, const std::string& text) {
    FILE* f = std::fopen(path.c_str(), "w");
    if (!f) return;
    std::fputs(text.c_str(), f);
    std::fclose(f);
}
void test_cgroup_quota() {
    char tmpl[] = "/tmp/fastcopy_cgroup_XXXXXX";
    const char* d = mkdtemp(tmpl);
    CHECK(d != nullptr, "mkdtemp");
    if (!d) return;
    const std::string root = d;
    auto mk = [](const std::string& p) { std::filesystem::create_directories(p); };
    // cgroup v2: root "max", /a 2.5 CPUs, /a/b 1.5 CPUs -> 1.5 from /a/b.
    const std::string v2 = root + "/v2";
    mk(v2 + "/a/b");
    write_file(v2 + "/cgroup.controllers", "cpuset cpu io memory pids\n");
    write_file(v2 + "/cpu.max", "max 100000\n");
    write_file(v2 + "/a/cpu.max", "250000 100000\n");
    write_file(v2 + "/a/b/cpu.max", "150000 100000\n");
    std::string src;
    double q = pool::cgroup_cpu_quota("0::/a/b\n", v2, &src);
    CHECK(q > 1.49 && q < 1.51 && src == v2 + "/a/b/cpu.max", "v2 nested: %.2f from %s", q, src.c_str());
    // Parent tighter than the child: /a 0.5 CPUs.
    write_file(v2 + "/a/cpu.max", "50000 100000\n");
    q = pool::cgroup_cpu_quota("0::/a/b\n", v2, &src);
    CHECK(q > 0.49 && q < 0.51, "v2 parent limit: %.2f from %s", q, src.c_str());
    // Inside a container the path may not exist under the mount: the root's cpu.max counts.
    write_file(v2 + "/cpu.max", "200000 100000\n");
    q = pool::cgroup_cpu_quota("0::/system.slice/docker-1234.scope\n", v2, &src);
    CHECK(q > 1.99 && q < 2.01, "v2 container root: %.2f from %s", q, src.c_str());
    // No quota anywhere.
    write_file(v2 + "/cpu.max", "max 100000\n");
    q = pool::cgroup_cpu_quota("0::/\n", v2, &src);
    CHECK(q == 0, "v2 no quota: %.2f", q);
    // cgroup v1 (hybrid: the v2 line has no cpu controller there): 3 CPUs below the root.
    const std::string v1 = root + "/v1";
    mk(v1 + "/cpu,cpuacct/docker/abc");
    write_file(v1 + "/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
    write_file(v1 + "/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
    write_file(v1 + "/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
    write_file(v1 + "/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "300000\n");
    q = pool::cgroup_cpu_quota("12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n", v1,
                               &src);
    CHECK(q > 2.99 && q < 3.01, "v1: %.2f from %s", q, src.c_str());
    q = pool::cgroup_cpu_quota("4:cpu,cpuacct:/\n", v1, &src);
    CHECK(q == 0, "v1 no quota: %.2f", q);
    CHECK(pool::cgroup_cpu_quota("", v1) == 0, "empty /proc/self/cgroup");
    std::error_code ec;
    std::filesystem::remove_all(root, ec);
}
#endif

void test_ping() {
    pool::set_threads(2);
    CHECK(pool::ping(), "ping on a 2-thread pool");
    CHECK(pool::started_workers() == 1, "workers=%u", pool::started_workers());
}

#if defined(HAVE_FORK)
double cpu_seconds() {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// How long idle workers spin: through the gap of a stream of copies (so the next one finds
// them awake), briefly after an isolated copy. The timing itself is tested in Python
// (tests/test_large_copies.py), where the copies' gaps are made.
void test_worker_spin_rule() {
    using pool::kIsolatedGapNs;
    using pool::kWorkerSpinNs;
    CHECK(kWorkerSpinNs < kIsolatedGapNs, "the spin after an isolated copy must be the shorter");
    CHECK(pool::worker_spin_ns(0) == kIsolatedGapNs, "back to back: spin %lld", (long long)pool::worker_spin_ns(0));
    CHECK(pool::worker_spin_ns(kIsolatedGapNs - 1) == kIsolatedGapNs, "just inside the stream gap: spin %lld",
          (long long)pool::worker_spin_ns(kIsolatedGapNs - 1));
    CHECK(pool::worker_spin_ns(kIsolatedGapNs) == kWorkerSpinNs, "at the isolated gap: spin %lld",
          (long long)pool::worker_spin_ns(kIsolatedGapNs));
    CHECK(pool::worker_spin_ns(std::int64_t(1) << 62) == kWorkerSpinNs, "the first copy (gap from 0): spin %lld",
          (long long)pool::worker_spin_ns(std::int64_t(1) << 62));
}

// An idle pool sleeps: after the spin window, the process uses (almost) no CPU.
void test_idle_pool_sleeps() {
    pool::set_threads(2);
    copy_and_check(4 << 20, 0, 0, copy_generic, 0, 11, "before idle");
    // CPU time, not wall time, so other load on the machine does not count. A worker that
    // spins instead of sleeping burns CPU in every window (even a starved one: at load 10 on
    // 2 CPUs it still gets ~20 % of one, 60 ms per 300 ms); a sleeping pool burns ~0. Up to
    // 10 windows, so one delayed by descheduling (the spin window ending late) cannot fail it.
    double used = 1.0;
    for (int attempt = 0; attempt < 10 && used >= 0.030; ++attempt) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // past the spin window
        const double c0 = cpu_seconds();
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        used = cpu_seconds() - c0;
        std::printf("idle: %.2f ms CPU in 300 ms with %u worker(s) started\n", used * 1e3,
                    pool::started_workers());
    }
    CHECK(used < 0.030, "idle pool used %.1f ms of CPU in each of 10 windows of 300 ms", used * 1e3);
}

// Runs `child` in a forked child; the child must exit 0 within `timeout_s`.
bool run_forked(const char* what, int timeout_s, void (*child)()) {
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = fork();
    if (pid < 0) {
        CHECK(false, "%s: fork failed", what);
        return false;
    }
    if (pid == 0) {
        g_failures = 0;  // count the child's own failures only
        alarm(unsigned(timeout_s) + 5);  // belt and braces: never outlive the parent's wait
        child();
        std::fflush(stdout);
        _exit(g_failures.load() == 0 ? 0 : 1);
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    int status = 0;
    for (;;) {
        const pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) break;
        if (std::chrono::steady_clock::now() > until) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            CHECK(false, "%s: child did not finish within %d s (deadlock?)", what, timeout_s);
            return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: child status 0x%x", what, status);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

void child_copies() {
    // The pool was started in the parent; here its workers do not exist.
    CHECK(pool::started_workers() == 0, "child sees %u workers", pool::started_workers());
    for (int i = 0; i < 5; ++i)
        copy_and_check((2 << 20) + 4097 * i, i, 2 * i, copy_generic, 0, 40 + i, "child");
    CHECK(pool::started_workers() >= 1, "child rebuilt no pool");
    CHECK(pool::ping(), "child ping");
}

void test_fork() {
    pool::set_threads(2);
    copy_and_check(2 << 20, 0, 0, copy_generic, 0, 21, "parent before fork");
    CHECK(pool::started_workers() == 1, "parent workers=%u", pool::started_workers());
    run_forked("fork after pool start", 60, child_copies);

    // Fork while other threads are in the middle of parallel copies (the pool lock and the
    // workers' states are mid-job in the parent at the moment of fork).
    std::atomic<bool> stop{false};
    std::atomic<int> bad{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 2; ++t)
        ts.emplace_back([t, &stop, &bad] {
            int i = 0;
            while (!stop.load())
                if (!copy_and_check((1 << 20) + 64 * (i++ % 7), t, 0, copy_generic, 4096,
                                    std::uint32_t(i), "during fork"))
                    bad.fetch_add(1);
        });
    for (int k = 0; k < 3; ++k) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        run_forked("fork during copies", 60, [] {
            for (int i = 0; i < 3; ++i)
                copy_and_check((1 << 20) + 123 * i, 1, 0, copy_generic, 0, 70 + i, "child2");
        });
    }
    stop = true;
    for (auto& th : ts) th.join();
    CHECK(bad == 0, "%d parent copies wrong around fork", bad.load());
    copy_and_check(2 << 20, 0, 0, copy_generic, 0, 22, "parent after fork");
}
#endif

// parallel_copy returns the chunks the workers copied: 0 on one thread, and over many copies
// on two threads the sum of what it returned is what stats() counted.
void test_worker_chunks_returned() {
    std::vector<unsigned char> src(1 << 20), dst(1 << 20);
    fill(src.data(), src.size(), 9);
    pool::set_threads(1);
    CHECK(pool::parallel_copy(dst.data(), src.data(), src.size(), copy_generic).worker_chunks == 0,
          "one thread: parallel_copy reported chunks copied by workers");
    pool::set_threads(2);
    const auto before = pool::stats().chunks_by_workers;
    std::size_t returned = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    // A starved worker may take no chunk for a while: copy until it took some (up to 5 s).
    while (returned == 0 && std::chrono::steady_clock::now() < until)
        for (int i = 0; i < 64; ++i) returned += pool::parallel_copy(dst.data(), src.data(), src.size(), copy_generic).worker_chunks;
    CHECK(returned > 0, "two threads: no copy in 5 s reported a chunk copied by a worker");
    CHECK(pool::stats().chunks_by_workers - before == returned,
          "parallel_copy returned %zu worker chunks, stats() counted %llu", returned,
          (unsigned long long)(pool::stats().chunks_by_workers - before));
    CHECK(src == dst, "copy with the chunk count returned");
    pool::set_threads(0);
}

}  // namespace

int main() {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    CHECK(pool::started_workers() == 0, "the pool must not start before the first copy");
    // Every copy below must really be split, however loaded the machine; the back-off
    // has its own test.
    pool::set_adaptive(false);
    test_sizing();
    test_worker_spin_rule();
#if defined(__linux__)
    test_cgroup_quota();
#endif
    test_ping();
    test_adaptive_backoff();
    test_boundaries();
    test_overlap_fallback();
    test_concurrent_callers();
    test_parallel_for();
    test_set_threads_during_copies();
    test_worker_chunks_returned();
#if defined(HAVE_FORK)
    test_idle_pool_sleeps();
    test_fork();
#endif
    const auto s = pool::stats();
    std::printf("stats: %llu parallel copies, %llu busy fallbacks, %llu chunks by workers, "
                "%llu pool starts, %llu late workers, %llu back-off fallbacks\n",
                (unsigned long long)s.parallel_copies, (unsigned long long)s.busy_fallbacks,
                (unsigned long long)s.chunks_by_workers, (unsigned long long)s.pools_started,
                (unsigned long long)s.late_events, (unsigned long long)s.backoff_fallbacks);
    CHECK(s.chunks_by_workers > 0, "workers never copied a chunk");
    if (g_failures.load()) {
        std::printf("pool_tests: %d FAILURES\n", g_failures.load());
        return 1;
    }
    std::printf("pool_tests: all passed\n");
    return 0;
}
