// Waiting: see spin.h.
#include "shm/spin.h"

#include <algorithm>
#include <cerrno>
#include <sched.h>

#include "shm/errors.h"

namespace fastcopy {
namespace shm {

namespace {
// The spin bounds (what each does and the measurement behind it: rules(), which
// fastcopy.info()["shm"] reports).
constexpr double kSpinMinDefault = 250e-6;
double g_spin_min = kSpinMinDefault;
// The longest spin: an end whose messages come further apart than this sleeps between them.
double g_spin_cap = 5e-3;
// In the middle of a streamed message the peer is copying the next chunk already.
double g_spin_mid_message = 10e-6;
constexpr unsigned kProbeEvery = 64;
// Polls (of 16 pauses each, about 1-2 us in all) before a spinning waiter starts to yield.
constexpr unsigned kPureSpinRounds = 16;
}  // namespace

void set_spin(double start_s, double mid_message_s) {
    g_spin_cap = start_s;
    g_spin_min = std::min(kSpinMinDefault, start_s);
    g_spin_mid_message = mid_message_s;
}
double spin_max_seconds() { return g_spin_cap; }
double spin_min_seconds() { return g_spin_min; }
double spin_mid_message_seconds() { return g_spin_mid_message; }

double AdaptiveSpin::budget() {
    if (spinning_) return std::min(g_spin_cap, std::max(g_spin_min, 2 * last_wait_s_));
    return ++probes_ % kProbeEvery == 0 ? g_spin_min : 0.0;  // probe now and then
}

void AdaptiveSpin::caught(double waited) {
    spinning_ = true;  // the spin caught the answer: keep spinning
    failures_ = 0;
    last_wait_s_ = waited;
}

void AdaptiveSpin::missed() {
    if (spinning_ && ++failures_ >= 3) spinning_ = false;
}

// A sleep that ended within the longest spin of the start: a spin would have caught the
// answer, and sleeping cost the peer a FUTEX_WAKE and this end a wake-up. Spin from now on.
// Without this, two ends that both sleep never see a probe succeed: each answer comes only
// after the peer's own wake-up, later than the probe's spin.
void AdaptiveSpin::slept(double waited) {
    last_wait_s_ = waited;
    if (!spinning_ && waited <= g_spin_cap) {
        spinning_ = true;
        failures_ = 0;
    }
}

// The first rounds spin on the CPU (a peer on another CPU answers in a microsecond or two);
// later rounds yield between polls, so that a peer waiting for this CPU runs.
void AdaptiveSpin::poll_pause(unsigned round) {
    if (round <= kPureSpinRounds) {
        for (int k = 0; k < 16; ++k) cpu_relax();
    } else {
        sched_yield();
    }
}

void GilGuard::check_signals_after(int futex_result) {
    if ((futex_result == EINTR || futex_result == ETIMEDOUT) && h.check_signals && released) {
        acquire();
        int pending = h.check_signals(h.ctx);
        release();
        if (pending) throw ShmInterrupted();
    }
}

}  // namespace shm
}  // namespace fastcopy
