// The operating-system layer of shared memory: see os.h.
#include "shm/os.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <vector>

namespace fastcopy {
namespace shm {

// ---- primitives -------------------------------------------------------------------------
std::uint64_t load_acquire_u64(const void* p) {
    return __atomic_load_n(static_cast<const std::uint64_t*>(p), __ATOMIC_ACQUIRE);
}
void store_release_u64(void* p, std::uint64_t v) {
    __atomic_store_n(static_cast<std::uint64_t*>(p), v, __ATOMIC_RELEASE);
}
std::uint32_t load_acquire_u32(const void* p) {
    return __atomic_load_n(static_cast<const std::uint32_t*>(p), __ATOMIC_ACQUIRE);
}
void store_release_u32(void* p, std::uint32_t v) {
    __atomic_store_n(static_cast<std::uint32_t*>(p), v, __ATOMIC_RELEASE);
}
std::uint32_t fetch_add_u32(void* p, std::uint32_t v) {
    return __atomic_fetch_add(static_cast<std::uint32_t*>(p), v, __ATOMIC_SEQ_CST);
}

int futex_wait(void* word, std::uint32_t expected, double timeout_s) {
    struct timespec ts;
    struct timespec* tsp = nullptr;
    if (timeout_s >= 0) {
        if (timeout_s > 1e6) timeout_s = 1e6;
        ts.tv_sec = static_cast<time_t>(timeout_s);
        ts.tv_nsec = static_cast<long>((timeout_s - static_cast<double>(ts.tv_sec)) * 1e9);
        if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
        tsp = &ts;
    }
    long r = syscall(SYS_futex, word, FUTEX_WAIT, expected, tsp, nullptr, 0);
    if (r == 0) return 0;
    int e = errno;
    if (e == EAGAIN) return 0;
    return e;
}

int futex_wake(void* word, int count) {
    long r = syscall(SYS_futex, word, FUTEX_WAKE, count, nullptr, nullptr, 0);
    return r < 0 ? 0 : static_cast<int>(r);
}

double monotonic_seconds() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

namespace {
// Reads state and start time from /proc/<pid>/stat. Returns false when unreadable.
bool read_proc_stat(std::uint32_t pid, char& state, std::uint64_t& start) {
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%u/stat", pid);
    int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    char buf[1024];
    ssize_t n = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
    if (n <= 0) return false;
    buf[n] = '\0';
    const char* p = std::strrchr(buf, ')');  // the command name may contain spaces and ')'
    if (!p || p[1] != ' ') return false;
    p += 2;
    state = *p;
    // Fields after ')': 3 state, 4 ppid, ... 22 starttime -> 19 separators after state.
    int field = 3;
    while (*p && field < 22) {
        if (*p == ' ') ++field;
        ++p;
    }
    if (field != 22) return false;
    start = std::strtoull(p, nullptr, 10);
    return true;
}
}  // namespace

std::uint64_t process_start_time(std::uint32_t pid) {
    char state;
    std::uint64_t start = 0;
    return read_proc_stat(pid, state, start) ? start : 0;
}

bool process_alive(std::uint32_t pid, std::uint64_t start_time) {
    if (pid == 0) return true;  // no peer yet: nothing to say
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
    char state = 0;
    std::uint64_t start = 0;
    if (!read_proc_stat(pid, state, start)) {
        // The process exists (kill said so) but /proc is unreadable or it just exited.
        return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH;
    }
    if (state == 'Z' || state == 'X' || state == 'x') return false;  // exited, not yet reaped
    if (start_time != 0 && start != start_time) return false;          // pid reused
    return true;
}

void futex_wake_all(void* word) {
    fetch_add_u32(word, 1);
    futex_wake(word, 1 << 30);
}

// ---- fork -----------------------------------------------------------------------------------
namespace {

std::atomic<std::uint64_t> g_fork_gen{1};

// Lock order around fork: the mutexes of hold_over_fork_first (in registration order), then
// g_fork_safe_mutex, then every ForkSafeMutex. The lists are never destroyed: a ledger may
// outlive this file's static objects (a view freed late in interpreter exit).
std::mutex g_fork_safe_mutex;
std::vector<ForkSafeMutex*>& fork_safe_list() {
    static auto* list = new std::vector<ForkSafeMutex*>();
    return *list;
}
std::vector<std::mutex*>& fork_first_list() {
    static auto* list = new std::vector<std::mutex*>();
    return *list;
}

void on_fork_prepare() {
    for (std::mutex* m : fork_first_list()) m->lock();
    g_fork_safe_mutex.lock();
    for (ForkSafeMutex* m : fork_safe_list()) m->lock();
}
// In the parent and in the child alike: the forking thread took the locks and, in the child,
// is the only thread, so it may release them.
void unlock_after_fork() {
    for (ForkSafeMutex* m : fork_safe_list()) m->unlock();
    g_fork_safe_mutex.unlock();
    std::vector<std::mutex*>& first = fork_first_list();
    for (auto it = first.rbegin(); it != first.rend(); ++it) (*it)->unlock();
}
void on_fork_parent() { unlock_after_fork(); }
void on_fork_child() {
    g_fork_gen.fetch_add(1, std::memory_order_relaxed);
    unlock_after_fork();
}
struct AtForkRegistrar {
    AtForkRegistrar() { pthread_atfork(on_fork_prepare, on_fork_parent, on_fork_child); }
} g_atfork_registrar;

}  // namespace

std::uint64_t fork_generation() { return g_fork_gen.load(std::memory_order_relaxed); }

void hold_over_fork_first(std::mutex& m) {
    std::lock_guard<std::mutex> lock(g_fork_safe_mutex);
    fork_first_list().push_back(&m);
}

ForkSafeMutex::ForkSafeMutex() {
    std::lock_guard<std::mutex> lock(g_fork_safe_mutex);
    fork_safe_list().push_back(this);
}

ForkSafeMutex::~ForkSafeMutex() {
    std::lock_guard<std::mutex> lock(g_fork_safe_mutex);
    std::vector<ForkSafeMutex*>& list = fork_safe_list();
    auto it = std::find(list.begin(), list.end(), this);
    if (it != list.end()) list.erase(it);
}

// ---- names to remove when SIGTERM or SIGHUP ends the creator -----------------------------
// atexit handlers do not run when a signal's default action ends the process, so a creator
// terminated by SIGTERM (e.g. multiprocessing.Pool.terminate(), `kill`, a service manager) or
// SIGHUP (its terminal closed) while blocked in a channel call left its /dev/shm names behind.
// While this process has created channels it has not unlinked, SIGTERM and SIGHUP (only when
// their action is the default, i.e. nobody installed a handler) get a handler that unlinks
// those names with unlink(2) (async-signal-safe) and then re-raises the signal with the
// default action, so the process still ends as the signal says. A handler installed later
// (signal.signal) replaces it. SIGKILL cannot be caught: `python -m fastcopy shm --clean`.
namespace {
constexpr int kCleanupSlots = 256;
constexpr std::size_t kCleanupPathBytes = 224;  // "/dev/shm/" + a name of up to 200 characters
struct CleanupSlot {
    std::atomic<int> state{0};  // 0 free, 1 being written, 2 ready
    pid_t pid = 0;              // the creator: a forked child does not remove its parent's names
    char path[kCleanupPathBytes] = {};
};
CleanupSlot g_cleanup[kCleanupSlots];
std::atomic<bool> g_cleanup_handlers_installed{false};
std::mutex g_cleanup_install_mutex;
constexpr int kCleanupSignals[] = {SIGTERM, SIGHUP};

extern "C" void unlink_created_then_die(int sig) {
    int saved = errno;
    pid_t me = ::getpid();
    for (auto& slot : g_cleanup)
        if (slot.state.load(std::memory_order_acquire) == 2 && slot.pid == me) ::unlink(slot.path);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(sig, &dfl, nullptr);
    errno = saved;
    ::raise(sig);  // pending until this handler returns, then the default action ends the process
}

void install_cleanup_handlers() {
    if (g_cleanup_handlers_installed.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(g_cleanup_install_mutex);
    if (g_cleanup_handlers_installed.load(std::memory_order_relaxed)) return;
    for (int sig : kCleanupSignals) {
        struct sigaction old {};
        if (::sigaction(sig, nullptr, &old) != 0) continue;
        if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) continue;  // someone else's choice
        struct sigaction sa {};
        sa.sa_handler = unlink_created_then_die;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;
        ::sigaction(sig, &sa, nullptr);
    }
    g_cleanup_handlers_installed.store(true, std::memory_order_release);
}
}  // namespace

void remove_on_fatal_signal(const std::string& name) {
    std::string path = "/dev/shm/" + name;
    if (path.size() >= kCleanupPathBytes) return;
    install_cleanup_handlers();
    pid_t me = ::getpid();
    for (auto& slot : g_cleanup) {
        int expected = 0;
        if (!slot.state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) continue;
        slot.pid = me;
        std::memcpy(slot.path, path.c_str(), path.size() + 1);
        slot.state.store(2, std::memory_order_release);
        return;
    }
    // All slots in use: this name is then only removed by unlink(), atexit or --clean.
}

void keep_on_fatal_signal(const std::string& name) {
    std::string path = "/dev/shm/" + name;
    pid_t me = ::getpid();
    for (auto& slot : g_cleanup) {
        int ready = 2;
        if (slot.pid != me || std::strcmp(slot.path, path.c_str()) != 0) continue;
        if (slot.state.compare_exchange_strong(ready, 1, std::memory_order_acq_rel)) {
            slot.path[0] = '\0';
            slot.pid = 0;
            slot.state.store(0, std::memory_order_release);
        }
    }
}

}  // namespace shm
}  // namespace fastcopy
