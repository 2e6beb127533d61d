// Persistent worker pool for large copies (see pool.h and docs/threads.md).
//
// Design in one paragraph: one caller at a time owns the pool (a try-lock, `g_busy`); a
// caller that finds it taken copies alone on its own thread, so concurrent callers never
// wait on each other and never put more than threads() threads on one copy. The owner puts
// a Job (on its own stack) in the mailbox of each worker it enlists and flips the worker's
// state word to GO. Workers and the caller then take 64-byte-aligned chunks from one atomic
// counter until none are left, so a worker that wakes late (or is descheduled by the host)
// simply gets fewer chunks. Before returning, the caller withdraws the job from workers
// that have not picked it up yet (CAS GO -> IDLE) and waits for those that did. Idle
// workers spin on plain loads for a short while, then sleep on a futex on their state word.
#include "pool/pool.h"
#include "pool/sizing.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

// FASTCOPY_POOL_NO_FUTEX: use the portable condition-variable wait on Linux too (to test it).
#if defined(__linux__)
#include <sched.h>
#include <unistd.h>
#endif
#if defined(__linux__) && !defined(FASTCOPY_POOL_NO_FUTEX)
#include <linux/futex.h>
#include <sys/syscall.h>
#define FASTCOPY_POOL_FUTEX 1
#else
#include <condition_variable>
#include <mutex>
#endif

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#include <signal.h>
#define FASTCOPY_POOL_POSIX 1
#endif

namespace fastcopy {
namespace pool {
namespace {

static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t), "futex word");
static_assert(std::atomic<std::uint32_t>::is_always_lock_free, "futex word");

constexpr std::size_t kLine = 64;
// How long the caller waits for a worker to finish its last chunk before sleeping.
constexpr std::int64_t kCallerSpinNs = 20'000;
// Within those windows, pure spinning on plain loads only for this long; after it, spin
// with a sched_yield() between bursts. When the other party is runnable on the *same* CPU
// (the machine is oversubscribed: other processes hold the other cores), pure spinning
// would hold the CPU for the whole window while the other party cannot run, turning a hand-off
// of under a microsecond into the whole spin window (evidence: pool-spin-yield).
constexpr std::int64_t kPureSpinNs = 1'000;
// Chunks per thread for load balancing, and the largest chunk.
constexpr std::size_t kChunksPerThread = 8;
constexpr std::size_t kMaxChunkBytes = 4u << 20;

// Worker states (the futex word).
enum : std::uint32_t {
    kIdle = 0,           // spinning, waiting for work
    kSleeping = 1,       // in futex_wait; whoever changes the state must wake it
    kGo = 2,             // a job is in the mailbox, not picked up yet
    kRunning = 3,        // copying chunks of the job
    kRunningWaited = 4,  // same, and the caller sleeps on the state word: wake it at the end
    kExit = 5,           // leave the thread
};

std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Spins until pred() or `budget_ns` elapsed; returns pred()'s last value. Plain loads, no
// PAUSE: under a hypervisor a PAUSE loop reacts several times slower (evidence: pool-no-pause).
// The clock is read every 256 tries.
template <class Pred>
bool spin_until(Pred pred, std::int64_t budget_ns) {
    const std::int64_t start = now_ns();
    for (;;) {
        for (int i = 0; i < 256; ++i)
            if (pred()) return true;
        const std::int64_t t = now_ns() - start;
        if (t > budget_ns) return false;
        if (t > kPureSpinNs) std::this_thread::yield();
    }
}

// ---- waiting ------------------------------------------------------------------------------
#if defined(FASTCOPY_POOL_FUTEX)
void wait_while(std::atomic<std::uint32_t>* w, std::uint32_t value) {
    while (w->load(std::memory_order_acquire) == value) {
        // Returns at once (EAGAIN) if the word no longer holds `value`; EINTR loops.
        syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(w), FUTEX_WAIT_PRIVATE, value,
                nullptr, nullptr, 0);
    }
}
void wake_all(std::atomic<std::uint32_t>* w) {
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(w), FUTEX_WAKE_PRIVATE, INT_MAX,
            nullptr, nullptr, 0);
}
void reset_wait_state_after_fork() {}
#else
// Portable fallback: one mutex/condition variable pair for every word. The waker changes
// the word before taking the mutex, the waiter checks it under the mutex: no lost wake-up.
std::mutex* g_wait_mu = new std::mutex;
std::condition_variable* g_wait_cv = new std::condition_variable;
void wait_while(std::atomic<std::uint32_t>* w, std::uint32_t value) {
    std::unique_lock<std::mutex> lk(*g_wait_mu);
    while (w->load(std::memory_order_acquire) == value) g_wait_cv->wait(lk);
}
void wake_all(std::atomic<std::uint32_t>*) {
    { std::lock_guard<std::mutex> lk(*g_wait_mu); }
    g_wait_cv->notify_all();
}
void reset_wait_state_after_fork() {  // the parent's may be held by threads that are gone
    g_wait_mu = new std::mutex;
    g_wait_cv = new std::condition_variable;
}
#endif

// ---- jobs and workers --------------------------------------------------------------------
struct Job {
    unsigned char* dst = nullptr;
    const unsigned char* src = nullptr;
    std::size_t n = 0;
    std::size_t head = 0;      // bytes before the first 64-byte-aligned dst address
    std::size_t chunk = 0;     // chunk size, a multiple of 64
    std::size_t nchunks = 0;
    CopyFn kernel = nullptr;
    // parallel_for jobs: chunk c is the call item(ctx, c) instead of a piece of one copy.
    void (*item)(void*, std::size_t) = nullptr;
    void* ctx = nullptr;
    bool woke_worker = false;  // a worker was asleep when the job was handed to it
    alignas(kLine) std::atomic<std::size_t> next{0};  // next chunk to take
};

// Chunk c covers [begin(c), begin(c+1)); every begin but the first and the end lands on a
// 64-byte-aligned dst address. Chunk 0 absorbs the unaligned head.
inline std::size_t chunk_begin(const Job& j, std::size_t c) {
    if (c == 0) return 0;
    const std::size_t b = j.head + c * j.chunk;
    return b < j.n ? b : j.n;
}

// Copies chunks until none are left; returns how many this thread copied.
std::size_t run_chunks(Job& j) {
    std::size_t done = 0;
    for (;;) {
        const std::size_t c = j.next.fetch_add(1, std::memory_order_relaxed);
        if (c >= j.nchunks) return done;
        if (j.item) {
            j.item(j.ctx, c);
            ++done;
            continue;
        }
        const std::size_t b = chunk_begin(j, c), e = chunk_begin(j, c + 1);
        if (e > b) j.kernel(j.dst + b, j.src + b, e - b);
        ++done;
    }
}

struct alignas(kLine) Worker {
    std::atomic<std::uint32_t> state{kIdle};
    Job* job = nullptr;  // written by the owner before state -> GO, read after GO -> RUNNING
    std::thread thread;
    std::atomic<std::int64_t> last_spin_ns{0};  // the spin it took when it last became idle
};

struct Pool {
    std::vector<Worker*> workers;
};

std::atomic<std::uint64_t> g_parallel_copies{0}, g_busy_fallbacks{0}, g_worker_chunks{0},
    g_pools_started{0}, g_late_events{0}, g_backoff_fallbacks{0}, g_asleep_fallbacks{0}, g_worker_sleeps{0};

// Adaptive back-off (see parallel_copy_chunked). g_backoff_* belong to the g_busy holder.
constexpr std::int64_t kLateSlackNs = 50'000;
constexpr std::int64_t kMinBackoffNs = 1'000'000;
constexpr std::int64_t kMaxBackoffNs = 100'000'000;
std::atomic<bool> g_adaptive{true};
std::int64_t g_backoff_until = 0;
std::int64_t g_backoff_ns = kMinBackoffNs / 2;
// When the last copy that held the pool ended (steady clock, ns); owned by the g_busy holder.
std::int64_t g_last_end_ns = 0;
// How long idle workers spin before sleeping (ns): set by the caller at each split copy from
// the gap before it (worker_spin_ns), read by each worker when it becomes idle.
std::atomic<std::int64_t> g_worker_spin_ns{kWorkerSpinNs};

void worker_main(Worker* w) {
#if defined(__linux__)
    pthread_setname_np(pthread_self(), "fastcopy-pool");
#endif
    for (;;) {
        std::uint32_t s = w->state.load(std::memory_order_acquire);
        if (s == kIdle) {
            const std::int64_t spin_ns = g_worker_spin_ns.load(std::memory_order_relaxed);
            w->last_spin_ns.store(spin_ns, std::memory_order_relaxed);
            spin_until([&] { return (s = w->state.load(std::memory_order_relaxed)) != kIdle; }, spin_ns);
            if (s == kIdle) {
                std::uint32_t expected = kIdle;
                if (w->state.compare_exchange_strong(expected, kSleeping,
                                                     std::memory_order_acq_rel)) {
                    g_worker_sleeps.fetch_add(1, std::memory_order_relaxed);
                    wait_while(&w->state, kSleeping);
                }
            }
            continue;
        }
        if (s == kGo) {
            std::uint32_t expected = kGo;
            if (!w->state.compare_exchange_strong(expected, kRunning,
                                                  std::memory_order_acq_rel))
                continue;  // withdrawn by the caller (-> IDLE) meanwhile
            Job* j = w->job;
            const std::size_t done = run_chunks(*j);
            if (done) g_worker_chunks.fetch_add(done, std::memory_order_relaxed);
            // Last touch of the job: after this the caller may return and free it.
            const std::uint32_t old = w->state.exchange(kIdle, std::memory_order_acq_rel);
            if (old == kRunningWaited) wake_all(&w->state);
            continue;
        }
        if (s == kExit) return;
        // kSleeping seen after a spurious wake: wait again.
        if (s == kSleeping) wait_while(&w->state, kSleeping);
    }
}

// Lets a worker run on any CPU the caller may run on but the caller's own, before it is woken
// or first runs. Woken from its futex, a worker is often placed on the waker's CPU, where the
// caller is busy with its share, and runs only when the scheduler next balances the CPUs: on a
// 2-vCPU VM about 2 ms later in most wakes, long after a copy of a few MiB has ended; kept off
// that CPU it joins within 60-190 us (evidence: pool-wake-off-caller-cpu). Nothing changes
// where the caller may run on one CPU only, or where the call fails (a cpuset, an emulator).
void keep_off_caller_cpu(Worker* w) {
#if defined(__linux__) && defined(FASTCOPY_POOL_POSIX)
    cpu_set_t mask;
    if (sched_getaffinity(0, sizeof mask, &mask) != 0) return;
    const int cpu = sched_getcpu();
    if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &mask) || CPU_COUNT(&mask) < 2) return;
    CPU_CLR(cpu, &mask);
    (void)pthread_setaffinity_np(w->thread.native_handle(), sizeof mask, &mask);
#else
    (void)w;
#endif
}

// Hands the job to an idle worker; returns whether it had to be woken from sleep.
bool enlist(Worker* w, Job* j) {
    w->job = j;
    if (w->state.load(std::memory_order_relaxed) == kSleeping) keep_off_caller_cpu(w);
    const std::uint32_t old = w->state.exchange(kGo, std::memory_order_acq_rel);
    if (old == kSleeping) wake_all(&w->state);
    return old == kSleeping;
}

// Whether the first `helpers` workers all sleep (none spinning, none busy).
bool all_asleep(const Pool& p, std::size_t helpers) {
    for (std::size_t i = 0; i < helpers; ++i)
        if (p.workers[i]->state.load(std::memory_order_acquire) != kSleeping) return false;
    return helpers > 0;
}

// After the caller ran out of chunks: withdraw the job from a worker that has not picked it
// up, or wait until the worker is done with it.
void retire(Worker* w) {
    std::uint32_t expected = kGo;
    if (w->state.compare_exchange_strong(expected, kIdle, std::memory_order_acq_rel)) return;
    // IDLE or SLEEPING: finished.
    if (spin_until([&] { return w->state.load(std::memory_order_acquire) != kRunning; },
                   kCallerSpinNs))
        return;
    std::uint32_t running = kRunning;
    if (w->state.compare_exchange_strong(running, kRunningWaited, std::memory_order_acq_rel))
        wait_while(&w->state, kRunningWaited);
    // Either the CAS failed because the worker finished, or it woke us after finishing. The
    // acquire load below orders its copies before ours.
    (void)w->state.load(std::memory_order_acquire);
}

// Stops a worker that is idle (no job) and joins it.
void stop_worker(Worker* w) {
    const std::uint32_t old = w->state.exchange(kExit, std::memory_order_acq_rel);
    if (old == kSleeping) wake_all(&w->state);
    if (w->thread.joinable()) w->thread.join();
    delete w;
}

// ---- global state ------------------------------------------------------------------------
// Only the holder of g_busy touches g_pool and its workers. The pool is never destroyed at
// exit (workers sleeping in the kernel die with the process; no static destructor runs
// while a copy may still use it).
std::atomic<bool> g_busy{false};
Pool* g_pool = nullptr;

std::atomic<unsigned> g_set_threads{0};   // set_threads(), 0 = not set
std::atomic<unsigned> g_env_threads{0};   // FASTCOPY_THREADS via set_env_threads(), 0 = unset
std::atomic<unsigned> g_default_cache{0};  // default_threads(), 0 = not computed yet

#if defined(FASTCOPY_POOL_POSIX)
std::atomic<bool> g_atfork_registered{false};
// In the child only the forking thread exists: the workers are gone and g_busy may be held
// by a thread that is gone too. Forget the parent's pool (leaked: its std::thread objects must
// not be destroyed) and let the next parallel copy build a fresh one.
void atfork_child() {
    g_pool = nullptr;
    g_backoff_until = 0;
    reset_wait_state_after_fork();
    g_busy.store(false, std::memory_order_relaxed);
}
#endif

void register_atfork_once() {
#if defined(FASTCOPY_POOL_POSIX)
    if (!g_atfork_registered.exchange(true)) pthread_atfork(nullptr, nullptr, atfork_child);
#endif
}

// Makes the pool have exactly `want` workers (creating or stopping some). Holder of g_busy.
Pool* pool_with(unsigned want) {
    if (!g_pool) {
        register_atfork_once();
        g_pool = new Pool;
        g_pools_started.fetch_add(1, std::memory_order_relaxed);
    }
    Pool* p = g_pool;
    while (p->workers.size() > want) {
        stop_worker(p->workers.back());
        p->workers.pop_back();
    }
    if (p->workers.size() < want) {
#if defined(FASTCOPY_POOL_POSIX)
        // Workers block every signal: Python's handlers must run on the threads it expects.
        sigset_t all, old;
        sigfillset(&all);
        // ...except faults, so a crash in a kernel is still reported as one.
        for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) sigdelset(&all, sig);
        pthread_sigmask(SIG_SETMASK, &all, &old);
#endif
        while (p->workers.size() < want) {
            Worker* w = new Worker;
            try {
                w->thread = std::thread(worker_main, w);
            } catch (...) {  // no more threads: work with what we have
                delete w;
                break;
            }
            keep_off_caller_cpu(w);
            p->workers.push_back(w);
        }
#if defined(FASTCOPY_POOL_POSIX)
        pthread_sigmask(SIG_SETMASK, &old, nullptr);
#endif
    }
    return p;
}

bool overlaps(const void* dst, const void* src, std::size_t n) {
    const auto d = reinterpret_cast<std::uintptr_t>(dst);
    const auto s = reinterpret_cast<std::uintptr_t>(src);
    return d < s + n && s < d + n;
}

unsigned clamp_threads(unsigned n) { return std::min(n, kMaxThreads); }

// The owner's part of a parallel job: take the pool (or run `alone` when it is busy, during
// the back-off, or when no worker can help), enlist workers, take chunks, retire workers.
// `t`: threads() as the caller read it (>= 2). Returns what the workers did.
template <class Alone>
SplitResult run_job(Job& job, unsigned t, Alone&& alone) {
    if (g_busy.exchange(true, std::memory_order_acquire)) {
        // Another caller's copy holds the pool: copy alone (no queueing, no waiting).
        g_busy_fallbacks.fetch_add(1, std::memory_order_relaxed);
        alone();
        return {};
    }
    const bool adaptive = g_adaptive.load(std::memory_order_relaxed);
    const std::int64_t t0 = adaptive ? now_ns() : 0;
    if (adaptive && t0 < g_backoff_until) {
        // Workers were late recently (descheduled: other processes hold the cores).
        g_last_end_ns = t0;  // a copy of the stream: the next one is not isolated
        g_busy.store(false, std::memory_order_release);
        g_backoff_fallbacks.fetch_add(1, std::memory_order_relaxed);
        alone();
        return {};
    }
    Pool* p = pool_with(t - 1);
    const std::size_t helpers = std::min<std::size_t>(p->workers.size(), job.nchunks - 1);
    if (adaptive && !job.item && job.n < kWakeWorkersMinBytes && t0 - g_last_end_ns > kIsolatedGapNs &&
        all_asleep(*p, helpers)) {
        // An isolated copy too small to pay for waking them: alone, and they sleep on.
        alone();
        g_last_end_ns = now_ns();
        g_asleep_fallbacks.fetch_add(1, std::memory_order_relaxed);
        g_busy.store(false, std::memory_order_release);
        return {};
    }
    g_worker_spin_ns.store(adaptive ? worker_spin_ns(t0 - g_last_end_ns) : kWorkerSpinNs,
                           std::memory_order_relaxed);
    for (std::size_t i = 0; i < helpers; ++i) job.woke_worker |= enlist(p->workers[i], &job);
    const std::size_t mine = run_chunks(job);
    const std::int64_t t1 = adaptive ? now_ns() : 0;
    for (std::size_t i = 0; i < helpers; ++i) retire(p->workers[i]);
    if (adaptive) {
        // A worker that holds a chunk while descheduled makes the caller wait for the
        // scheduler (milliseconds when the machine is oversubscribed), which no chunking
        // can hide. Waiting much longer than a chunk takes the caller means exactly that:
        // then copy alone for a while (1 ms, doubling while it repeats, up to 100 ms).
        const std::int64_t t2 = now_ns();
        g_last_end_ns = t2;
        const std::int64_t per_chunk = (t1 - t0) / std::int64_t(mine ? mine : 1);
        if (t2 - t1 > 4 * per_chunk + kLateSlackNs) {
            g_backoff_ns = std::min<std::int64_t>(g_backoff_ns * 2, kMaxBackoffNs);
            g_backoff_until = t2 + g_backoff_ns;
            g_late_events.fetch_add(1, std::memory_order_relaxed);
        } else {
            g_backoff_ns = std::max<std::int64_t>(g_backoff_ns / 2, kMinBackoffNs / 2);
        }
    }
    g_parallel_copies.fetch_add(1, std::memory_order_relaxed);
    g_busy.store(false, std::memory_order_release);
    return {job.nchunks - mine, job.woke_worker};
}

}  // namespace

// ---- public API --------------------------------------------------------------------------
unsigned default_threads() {
    unsigned d = g_default_cache.load(std::memory_order_relaxed);
    if (d == 0) {
        d = detail::compute_sizing().result;
        g_default_cache.store(d, std::memory_order_relaxed);
    }
    return d;
}

unsigned threads() {
    if (unsigned n = g_set_threads.load(std::memory_order_relaxed)) return n;
    if (unsigned n = g_env_threads.load(std::memory_order_relaxed)) return n;
    return default_threads();
}

void set_threads(unsigned n) { g_set_threads.store(clamp_threads(n), std::memory_order_relaxed); }
void set_env_threads(unsigned n) {
    g_env_threads.store(clamp_threads(n), std::memory_order_relaxed);
}

std::string threads_reason() {
    std::ostringstream o;
    if (unsigned n = g_set_threads.load()) {
        o << n << (n == 1 ? " (set_threads(1): threading disabled)" : " (set_threads)");
        return o.str();
    }
    if (unsigned n = g_env_threads.load()) {
        o << n << (n == 1 ? " (FASTCOPY_THREADS=1: threading disabled)" : " (FASTCOPY_THREADS)");
        return o.str();
    }
    const detail::Sizing s = detail::compute_sizing();
    o << s.result << " (default: " << s.cpus << " CPU" << (s.cpus == 1 ? "" : "s")
      << " in the affinity mask";
    if (s.quota > 0) {
        o.precision(3);
        o << ", cgroup CPU quota " << s.quota << " from " << s.quota_src;
    } else {
        o << ", no cgroup CPU quota";
    }
    if (s.result == kDefaultThreadsCap && std::min(s.cpus, s.quota > 0 ? unsigned(s.quota + 0.999) : s.cpus) > kDefaultThreadsCap)
        o << ", capped at " << kDefaultThreadsCap;
    o << ")";
    return o.str();
}

namespace {
// parallel_copy_chunked on `t` threads (caller included).
SplitResult chunked_on(void* dst, const void* src, std::size_t n, CopyFn kernel, std::size_t chunk_bytes, unsigned t);
std::size_t chunk_for(std::size_t n, unsigned t) {
    std::size_t chunk = n / (std::size_t(t) * kChunksPerThread);
    return std::min(std::max(chunk, kMinChunkBytes), kMaxChunkBytes);
}
}  // namespace

SplitResult parallel_copy_chunked(void* dst, const void* src, std::size_t n, CopyFn kernel,
                                  std::size_t chunk_bytes) {
    return chunked_on(dst, src, n, kernel, chunk_bytes, threads());
}

SplitResult parallel_copy_threads(void* dst, const void* src, std::size_t n, CopyFn kernel, unsigned threads_wanted) {
    const unsigned t = std::max(1u, std::min(threads_wanted, kMaxThreads));
    return chunked_on(dst, src, n, kernel, chunk_for(n, t), t);
}

namespace {
SplitResult chunked_on(void* dst, const void* src, std::size_t n, CopyFn kernel, std::size_t chunk_bytes, unsigned t) {
    if (n == 0) return {};
    chunk_bytes = std::max<std::size_t>(kLine, (chunk_bytes + kLine - 1) & ~(kLine - 1));
    Job job;
    job.dst = static_cast<unsigned char*>(dst);
    job.src = static_cast<const unsigned char*>(src);
    job.n = n;
    job.kernel = kernel;
    job.chunk = chunk_bytes;
    job.head = (kLine - (reinterpret_cast<std::uintptr_t>(dst) & (kLine - 1))) & (kLine - 1);
    job.nchunks = n > job.head ? (n - job.head + chunk_bytes - 1) / chunk_bytes : 1;
    // Defensive: dispatch never sends overlapping ranges here, but if it did, chunks copied
    // concurrently would not give memmove's result. One kernel call does.
    if (t <= 1 || job.nchunks <= 1 || overlaps(dst, src, n)) {
        kernel(dst, src, n);
        return {};
    }
    return run_job(job, t, [&] { kernel(dst, src, n); });
}
}  // namespace

void parallel_for(std::size_t n, void (*item)(void* ctx, std::size_t index), void* ctx) {
    if (n == 0) return;
    auto alone = [&] {
        for (std::size_t i = 0; i < n; ++i) item(ctx, i);
    };
    const unsigned t = threads();
    if (n == 1 || t <= 1) {
        alone();
        return;
    }
    Job job;
    job.item = item;
    job.ctx = ctx;
    job.nchunks = n;
    run_job(job, t, alone);
}

void set_adaptive(bool on) { g_adaptive.store(on, std::memory_order_relaxed); }

SplitResult parallel_copy(void* dst, const void* src, std::size_t n, CopyFn kernel) {
    const unsigned t = std::max(1u, threads());
    return parallel_copy_chunked(dst, src, n, kernel, chunk_for(n, t));
}

bool ping() {
    if (threads() <= 1) return false;
    if (g_busy.exchange(true, std::memory_order_acquire)) return false;
    Pool* p = pool_with(threads() - 1);
    bool ok = false;
    if (!p->workers.empty()) {
        Job job;  // no chunks: the worker picks it up and is done at once
        Worker* w = p->workers[0];
        enlist(w, &job);
        // Wait for the worker to take it (no withdrawal: this measures the round trip).
        while (!spin_until([&] {
            const std::uint32_t s = w->state.load(std::memory_order_acquire);
            return s == kIdle || s == kSleeping;
        }, kCallerSpinNs)) {
        }
        ok = true;
    }
    g_busy.store(false, std::memory_order_release);
    return ok;
}

namespace {
// Reads `read(g_pool)` under the pool lock (g_pool may be null), so the pool cannot be rebuilt
// meanwhile; waits while a copy holds the pool.
template <class Read>
auto read_pool(Read&& read) {
    while (g_busy.exchange(true, std::memory_order_acquire)) std::this_thread::yield();
    const auto value = read(g_pool);
    g_busy.store(false, std::memory_order_release);
    return value;
}
}  // namespace

unsigned started_workers() {
    return read_pool([](const Pool* p) { return p ? unsigned(p->workers.size()) : 0u; });
}

unsigned sleeping_workers() {
    return read_pool([](const Pool* p) {
        unsigned n = 0;
        if (p)
            for (const Worker* w : p->workers) n += w->state.load(std::memory_order_acquire) == kSleeping;
        return n;
    });
}

std::int64_t worker_spin_now_ns() { return g_worker_spin_ns.load(std::memory_order_relaxed); }

std::int64_t last_worker_spin_ns() {
    return read_pool([](const Pool* p) -> std::int64_t {
        return p && !p->workers.empty() ? p->workers[0]->last_spin_ns.load(std::memory_order_relaxed) : 0;
    });
}

Stats stats() {
    Stats s;
    s.parallel_copies = g_parallel_copies.load(std::memory_order_relaxed);
    s.busy_fallbacks = g_busy_fallbacks.load(std::memory_order_relaxed);
    s.late_events = g_late_events.load(std::memory_order_relaxed);
    s.backoff_fallbacks = g_backoff_fallbacks.load(std::memory_order_relaxed);
    s.asleep_fallbacks = g_asleep_fallbacks.load(std::memory_order_relaxed);
    s.worker_sleeps = g_worker_sleeps.load(std::memory_order_relaxed);
    s.chunks_by_workers = g_worker_chunks.load(std::memory_order_relaxed);
    s.pools_started = g_pools_started.load(std::memory_order_relaxed);
    return s;
}

}  // namespace pool
}  // namespace fastcopy
