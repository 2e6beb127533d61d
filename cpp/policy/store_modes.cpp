// The store-mode rule: see store_modes.h.
#include "store_modes.h"

#include <algorithm>
#include <thread>

namespace fastcopy {
namespace policy {

int StoreModeLearner::class_of(std::size_t n) const {
    if (n < kMinBytes) return -1;
    int doublings = 0;
    for (std::size_t lo = kMinBytes; n >= lo * 2 && doublings < 64; lo *= 2) ++doublings;
    return std::min(classes() - 1, doublings / static_cast<int>(rule_.octaves_per_class));
}

bool StoreModeLearner::streaming(std::size_t n, bool start_streaming) {
    const int c = class_of(n);
    if (c < 0) return false;
    TryLock lock(busy_);
    if (!lock.held()) return start_streaming;
    ClassState& s = cls_[c];
    if (!s.started) {
        s.started = true;
        s.current_streaming = start_streaming;
        s.explore_every = first_explore(start_streaming);
    }
    // No trial while the last one awaits its judgement (judge_after), nor while the current
    // mode's rate comes from the class's first write alone (a trial would be judged against it).
    if (!s.trial && s.pending_rate == 0 && !s.first_write_rate[s.current_streaming ? 1 : 0] &&
        ++s.since_trial >= s.explore_every) {
        s.since_trial = 0;
        // Cached stores far ahead of streaming ones: count the trial as lost without running
        // it; at explore_max it runs anyway (the streaming rate may be stale).
        if (!s.current_streaming && s.rate[1] > 0 && s.rate[0] > rule_.trial_within * s.rate[1] &&
            s.explore_every < explore_cap(false)) {
            s.explore_every = std::min(explore_cap(false), s.explore_every * rule_.explore_growth);
        } else {
            s.trial = true;
            s.trial_left = s.current_streaming ? rule_.cached_trial_copies : rule_.streaming_trial_copies;
        }
    }
    return s.trial ? !s.current_streaming : s.current_streaming;
}

bool StoreModeLearner::settled_streaming(std::size_t n, bool start_streaming) const {
    const int c = class_of(n);
    if (c < 0) return false;
    const ClassState s = state(c);
    return s.started ? s.current_streaming : start_streaming;
}

void StoreModeLearner::record(std::size_t n, bool streaming, double seconds) {
    const int c = class_of(n);
    if (c < 0 || !(seconds > 0)) return;
    TryLock lock(busy_);
    if (!lock.held()) return;
    ClassState& s = cls_[c];
    const double rate = double(n) / seconds;
    const int mode = streaming ? 1 : 0, current = s.current_streaming ? 1 : 0;
    ++s.writes[mode];
    if (s.writes[0] + s.writes[1] == 1) {
        s.rate[mode] = rate;
        s.first_write_rate[mode] = true;
        return;
    }
    if (mode != current && s.trial && s.trial_left > 1) {
        // Not the last copy of a trial: it leaves the caches as that mode leaves them, so that
        // the last one is timed as the mode runs when it keeps running.
        --s.trial_left;
        return;
    }
    // A trial of streaming stores judged against the judge_after-th cached copy after it.
    if (mode == current && s.pending_rate > 0) {
        if (s.pending_skip > 0) {
            --s.pending_skip;
            return;
        }
        fold_rate(s, mode, rate);
        const double trial_rate = s.pending_rate;
        s.pending_rate = 0;
        end_trial(s, true, trial_rate > rule_.to_streaming_margin * rate);
        return;
    }
    // A trial's rate replaces the mode's old one (measured long ago); the current mode's rate
    // moves towards each write by rate_weight, so that one write slowed by the caches another
    // copy left behind does not make it look slow.
    if (mode == current) fold_rate(s, mode, rate);
    else {
        s.rate[mode] = rate;
        s.first_write_rate[mode] = false;
    }
    // The factor by which the other mode must beat this one to take over.
    auto margin_to = [this](int to_mode) { return to_mode == 1 ? rule_.to_streaming_margin : rule_.to_cached_margin; };
    if (mode != current) {
        // A trial of the other mode (or a write decided before a switch): take over if it
        // is clearly faster, else try again later.
        s.trial = false;
        if (mode == 1 && rule_.judge_after > 0) {
            s.pending_rate = rate;
            s.pending_skip = rule_.judge_after - 1;
            return;
        }
        end_trial(s, streaming, rate > margin_to(mode) * s.rate[current]);
        return;
    }
    // The current mode's rate fell below the other mode's last rate, rule_.slow_to_leave times
    // in a row: switch (the other's rate may be stale; if so, its writes show it and switch back).
    if (!(s.rate[1 - mode] > margin_to(1 - mode) * s.rate[mode])) {
        s.slow_streak = 0;
        return;
    }
    if (++s.slow_streak >= rule_.slow_to_leave) switch_to(s, !s.current_streaming);
}

void StoreModeLearner::fold_rate(ClassState& s, int mode, double rate) const {
    const bool replace = s.rate[mode] <= 0 || s.first_write_rate[mode];
    s.rate[mode] = replace ? rate : s.rate[mode] + rule_.rate_weight * (rate - s.rate[mode]);
    s.first_write_rate[mode] = false;
}

unsigned StoreModeLearner::first_explore(bool streaming) const {
    return streaming ? std::max(rule_.explore_min, rule_.explore_first_while_streaming) : rule_.explore_min;
}

void StoreModeLearner::switch_to(ClassState& s, bool streaming) const {
    s.current_streaming = streaming;
    s.slow_streak = 0;
    s.explore_every = first_explore(streaming);
    s.since_trial = 0;
    ++s.switches;
}

void StoreModeLearner::end_trial(ClassState& s, bool tried_streaming, bool won) const {
    if (won) switch_to(s, tried_streaming);
    else s.explore_every = std::min(explore_cap(s.current_streaming), s.explore_every * rule_.explore_growth);
}

unsigned StoreModeLearner::explore_cap(bool streaming) const {
    return !streaming && rule_.explore_max_while_cached ? rule_.explore_max_while_cached : rule_.explore_max;
}

StoreModeLearner::ClassState StoreModeLearner::state(int cls) const {
    // A reader (info, tests) waits a little: holders keep the flag for a few steps only. A
    // flag that stays taken (inherited set across fork()) gives the figures as they are.
    const int c = std::max(0, std::min(classes() - 1, cls));
    for (int tries = 0; tries < 100000; ++tries) {
        TryLock lock(busy_);
        if (lock.held()) return cls_[c];
        std::this_thread::yield();
    }
    return cls_[c];
}

void StoreModeLearner::reset() {
    for (int tries = 0; tries < 100000; ++tries) {
        TryLock lock(busy_);
        if (lock.held()) {
            for (ClassState& c : cls_) {
                c = ClassState{};
                c.explore_every = rule_.explore_min;
            }
            return;
        }
        std::this_thread::yield();
    }
}

std::string StoreModeLearner::class_name(int cls) const {
    const int c = std::max(0, std::min(classes() - 1, cls));
    auto words = [](std::size_t b, bool unit) {
        const bool mib = b >= (std::size_t(1) << 20);
        return std::to_string(mib ? b >> 20 : b >> 10) + (unit ? (mib ? " MiB" : " KiB") : "");
    };
    const std::size_t lo = kMinBytes << (c * rule_.octaves_per_class), hi = lo << rule_.octaves_per_class;
    if (c == classes() - 1) return words(lo, true) + " and more";
    const bool same_unit = (lo >= (std::size_t(1) << 20)) == (hi >= (std::size_t(1) << 20));
    return words(lo, !same_unit) + "-" + words(hi, true);
}

}  // namespace policy
}  // namespace fastcopy
