// The operating-system layer of shared memory: atomic words in shared memory, futex waits,
// process liveness through /proc, fork safety (pthread_atfork) and removal of created names
// when SIGTERM or SIGHUP ends the process. Nothing here knows a segment layout.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>

namespace fastcopy {
namespace shm {

// ---- primitives on a 4- or 8-byte aligned word in shared memory -------------------------
std::uint64_t load_acquire_u64(const void* p);
void store_release_u64(void* p, std::uint64_t v);
std::uint32_t load_acquire_u32(const void* p);
void store_release_u32(void* p, std::uint32_t v);
std::uint32_t fetch_add_u32(void* p, std::uint32_t v);
inline std::uint64_t load_seq_cst_u64(const void* p) {
    return __atomic_load_n(static_cast<const std::uint64_t*>(p), __ATOMIC_SEQ_CST);
}
inline void store_seq_cst_u64(void* p, std::uint64_t v) {
    __atomic_store_n(static_cast<std::uint64_t*>(p), v, __ATOMIC_SEQ_CST);
}
inline bool cas_u32(void* p, std::uint32_t expected, std::uint32_t desired) {
    return __atomic_compare_exchange_n(static_cast<std::uint32_t*>(p), &expected, desired, false, __ATOMIC_SEQ_CST,
                                       __ATOMIC_SEQ_CST);
}

// FUTEX_WAIT (shared, not _PRIVATE) while *word == expected, at most timeout_s seconds (< 0:
// no limit). Returns 0 when woken or the value differed, ETIMEDOUT on timeout, EINTR on a signal.
int futex_wait(void* word, std::uint32_t expected, double timeout_s);
// FUTEX_WAKE (shared); returns how many waiters were woken.
int futex_wake(void* word, int count);
// Wakes every waiter on a futex word (after a full fence by the caller): changes the word
// first, so a waiter about to sleep on the old value does not.
void futex_wake_all(void* word);
double monotonic_seconds();

// True unless the process is known to be gone: kill(pid, 0) says ESRCH, /proc says zombie,
// or its start time differs from start_time (pid reused). start_time 0 = not checked.
bool process_alive(std::uint32_t pid, std::uint64_t start_time);
// Start time (clock ticks after boot, /proc/<pid>/stat field 22) of a process; 0 if unknown.
std::uint64_t process_start_time(std::uint32_t pid);
// Sleeping waiters wake at least this often (seconds) to check the peer's liveness.
constexpr double kLivenessSlice = 0.05;

// ---- fork ---------------------------------------------------------------------------------
// Starts at 1 and grows by one in the child of every fork(): state stamped with an older
// generation is a parent's (its roles, its claims, its threads' flags).
std::uint64_t fork_generation();

// A std::mutex that fork() never leaves locked in the child. The slot ledgers are locked by
// whichever thread releases a view (from the array's destructor) or moves the consumer's tail,
// some of them with the GIL released, so another thread may fork while one holds it; the
// child, where that thread does not exist, would then hang at its first view release or claim.
// Every ForkSafeMutex is registered; a pthread_atfork handler locks them all before fork() and
// unlocks them in both processes after it. Critical sections under it must not wait for the
// GIL or for another ForkSafeMutex (the forking thread holds the GIL while it waits for them).
class ForkSafeMutex : public std::mutex {
public:
    ForkSafeMutex();
    ~ForkSafeMutex();
    ForkSafeMutex(const ForkSafeMutex&) = delete;
    ForkSafeMutex& operator=(const ForkSafeMutex&) = delete;
};
// A process-wide mutex that fork() never leaves locked either, locked before every
// ForkSafeMutex (for a lock whose holder then takes a ForkSafeMutex). Call once, at static
// initialisation; `m` lives for ever.
void hold_over_fork_first(std::mutex& m);

// ---- names to remove when a fatal signal ends the creator -----------------------------------
// Names this process created: removed from /dev/shm if SIGTERM or SIGHUP (default action) ends
// it; keep_on_fatal_signal() forgets one (it was unlinked).
void remove_on_fatal_signal(const std::string& name);
void keep_on_fatal_signal(const std::string& name);

}  // namespace shm
}  // namespace fastcopy
