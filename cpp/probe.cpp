// See probe.h.
#include "probe.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

namespace fastcopy {
namespace probe {

#if defined(__linux__)
namespace {

bool pin_this_thread(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

struct alignas(64) Line {
    std::atomic<std::uint32_t> turn{0};  // even: cpu_a's turn to write, odd: cpu_b's
};

struct Shared {
    Line line;
    alignas(64) std::atomic<bool> stop{false};
    std::atomic<int> pinned{0};  // 1: cpu_b's thread is pinned, -1: it could not be
};

}  // namespace

double cache_line_round_trip_ns(int cpu_a, int cpu_b, unsigned rounds, double limit_s) {
    if (cpu_a == cpu_b) throw std::invalid_argument("the two CPUs must differ (got " + std::to_string(cpu_a) + " twice)");
    cpu_set_t mask;
    CPU_ZERO(&mask);
    if (sched_getaffinity(0, sizeof mask, &mask) != 0) throw std::runtime_error("sched_getaffinity failed");
    for (int cpu : {cpu_a, cpu_b})
        if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &mask))
            throw std::invalid_argument("CPU " + std::to_string(cpu) + " is not in this process's affinity mask");
    if (rounds < 1 || rounds > kMaxRounds)
        throw std::invalid_argument("rounds must be 1 to " + std::to_string(kMaxRounds) + ", got " + std::to_string(rounds));
    constexpr unsigned kBlock = 64;
    const unsigned blocks = std::max(1u, rounds / kBlock);
    const unsigned warmup_blocks = std::max(1u, blocks / 10);
    const unsigned blocks_total = warmup_blocks + blocks;
    const std::uint32_t total = blocks_total * kBlock;
    Shared sh;
    // cpu_b: answer every odd turn with the next even one.
    std::thread answerer([&] {
        if (!pin_this_thread(cpu_b)) {
            sh.pinned.store(-1);
            return;
        }
        sh.pinned.store(1);
        for (std::uint32_t expect = 1; expect < 2 * total; expect += 2) {
            while (sh.line.turn.load(std::memory_order_acquire) != expect)
                if (sh.stop.load(std::memory_order_relaxed)) return;
            sh.line.turn.store(expect + 1, std::memory_order_release);
        }
    });
    // cpu_a: this work runs on a second thread too, so the caller's own affinity is untouched.
    std::vector<double> trips;
    std::string failure;
    std::thread asker([&] {
        if (!pin_this_thread(cpu_a)) {
            failure = "cannot pin a thread to CPU " + std::to_string(cpu_a);
            return;
        }
        using clock = std::chrono::steady_clock;
        const auto deadline = clock::now() + std::chrono::duration<double>(limit_s);
        while (sh.pinned.load() == 0) std::this_thread::yield();
        if (sh.pinned.load() < 0) {
            failure = "cannot pin a thread to CPU " + std::to_string(cpu_b);
            return;
        }
        // Timed in blocks of kBlock round trips (two clock reads per trip would add about
        // 40 ns to each); the median block is the answer, so a preempted block does not count.
        std::uint32_t k = 0;
        for (unsigned block = 0; block < blocks_total; ++block) {
            const auto t0 = clock::now();
            for (unsigned i = 0; i < kBlock; ++i, ++k) {
                sh.line.turn.store(2 * k + 1, std::memory_order_release);
                for (unsigned spins = 1; sh.line.turn.load(std::memory_order_acquire) != 2 * k + 2; ++spins) {
                    if ((spins & 1023) == 0 && clock::now() > deadline) {
                        failure = "the two threads stalled for more than " + std::to_string(limit_s) +
                                  " s (is CPU " + std::to_string(cpu_b) + " busy?)";
                        return;
                    }
                }
            }
            if (block >= warmup_blocks)
                trips.push_back(std::chrono::duration<double, std::nano>(clock::now() - t0).count() / kBlock);
        }
    });
    asker.join();
    sh.stop.store(true);
    answerer.join();
    if (!failure.empty()) throw std::runtime_error(failure);
    std::nth_element(trips.begin(), trips.begin() + trips.size() / 2, trips.end());
    return trips[trips.size() / 2];
}

#else

double cache_line_round_trip_ns(int, int, unsigned, double) {
    throw std::runtime_error("cache_line_round_trip_ns needs Linux (pthread_setaffinity_np)");
}

#endif

}  // namespace probe
}  // namespace fastcopy
