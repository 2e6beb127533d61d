// How the ends of a Channel or a Topic wait: an adaptive spin before they sleep on a futex
// (AdaptiveSpin), and the GIL callbacks around sleeps and large copies (GilHooks, GilGuard).
#pragma once
#include <cstdint>

#include "shm/os.h"

namespace fastcopy {
namespace shm {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
}

// How long a waiter spins (checking the index) before it sleeps on the futex, learnt per
// waiting end. Used by the Channel's waits at the start of a message and by the Topic's
// publisher and subscribers.
//
// An end that is not "spinning" does not spin, except for a probe every 64 waits that spins
// up to spin_min_seconds(). A wait that ends within spin_max_seconds() of its start (caught by
// the spin, or woken from a sleep that early) switches spinning on; a spinning end spins for
// twice its last wait, between the two; three spins in a row that do not catch the answer
// switch it off. After a microsecond or two of pure spinning the spin yields the CPU between
// polls, so a peer (or anything else) that waits for this CPU runs. Sleeping costs the peer a
// FUTEX_WAKE and this end a scheduler wake-up, which on a VM can cost more than the message.
// evidence: shm-adaptive-spin
class AdaptiveSpin {
public:
    // Seconds to spin in this wait (0: sleep at once).
    double budget();
    // Spins until ready() or `seconds` passed (from `start`); true when ready() held. With
    // `learn` (a wait of budget() seconds), records the outcome. The caller sleeps when it
    // returns false.
    template <class Ready>
    bool spin(Ready&& ready, double start, double seconds, bool learn) {
        const double until = start + seconds;
        for (unsigned i = 1;; ++i) {
            poll_pause(i);
            if (ready()) {
                if (learn && seconds > 0) caught(monotonic_seconds() - start);
                return true;
            }
            if ((i & 7) == 0 && monotonic_seconds() >= until) break;
        }
        if (learn && seconds > 0) missed();
        return false;
    }
    // The answer came after a sleep, `waited` seconds after the wait started.
    void slept(double waited);
    // One polling round: a short burst of pause instructions at first, then sched_yield().
    static void poll_pause(unsigned round);

private:
    void caught(double waited);
    void missed();
    bool spinning_ = false;
    unsigned failures_ = 0, probes_ = 0;
    double last_wait_s_ = 0;  // seconds the last wait took
};

// How long waits spin before sleeping: the most an adaptive wait at the start of a message
// spins (0: never; default 5 ms), and the fixed spin in the middle of a streamed message.
void set_spin(double start_s, double mid_message_s);
double spin_max_seconds();          // the longest adaptive spin (set_spin's start_s)
double spin_min_seconds();          // the shortest adaptive spin, and the probe's
double spin_mid_message_seconds();  // the fixed spin in the middle of a streamed message

// The GIL around blocking waits and large copies, as callbacks (nullptr: never released).
// check_signals (optional) runs with the GIL held while a wait sleeps (on EINTR and every sleep
// slice); nonzero means a Python exception (e.g. KeyboardInterrupt) is pending and the wait
// ends with ShmInterrupted.
struct GilHooks {
    void (*release)(void*);
    void (*acquire)(void*);
    void* ctx;
    int (*check_signals)(void*);
};

// The GIL around a wait or a copy, through GilHooks. `already_released`: the caller released
// it already (in the middle of a message); the guard may take it briefly to run signal
// handlers and leaves it released.
struct GilGuard {
    const GilHooks& h;
    bool released = false;
    bool borrowed = false;
    explicit GilGuard(const GilHooks& hooks, bool already_released = false)
        : h(hooks), released(already_released && hooks.release), borrowed(already_released && hooks.release) {}
    void release() {
        if (!released && h.release) { h.release(h.ctx); released = true; }
    }
    void acquire() {
        if (released) { h.acquire(h.ctx); released = false; }
    }
    // With the GIL released: runs the signal handlers (taking the GIL briefly); ShmInterrupted
    // when one raised. For a sleep that ended with EINTR or ETIMEDOUT (futex_wait's result).
    void check_signals_after(int futex_result);
    ~GilGuard() {
        if (borrowed) release();
        else acquire();
    }
};

}  // namespace shm
}  // namespace fastcopy
