// Measurements of the machine that benchmark reports print beside their figures. Nothing in
// the policy reads them.
#pragma once

namespace fastcopy {
namespace probe {

// Nanoseconds for one cache line to go from CPU `cpu_a` to CPU `cpu_b` and back: two threads
// pinned to those CPUs take turns writing one shared line, about `rounds` times, timed in
// blocks of 64 turns after a tenth as many of warm-up; the median block's mean.
//
// It says how far apart the two CPUs are. On the 2-vCPU Zen 3 KVM guest it flipped between
// about 110 ns and 450-520 ns as the host moved its vCPU threads (65-68 ns now and then). Of 30
// runs of a Channel moving 1 MiB messages between two processes, 10 of the 11 at 5-8.3 GB/s
// had a probe of 400-530 ns before or after, and 8 of the 11 at 20-25 GB/s had both near.
//
// Throws std::invalid_argument when a CPU is not in this process's affinity mask, cpu_a ==
// cpu_b, or rounds is outside 1..kMaxRounds; std::runtime_error when a thread cannot be pinned
// or the turns stall for longer than `limit_s` (the other CPU is taken by something else).
// Linux only (elsewhere: std::runtime_error).
constexpr unsigned kMaxRounds = 1u << 24;  // about 8 s at 500 ns; keeps the turn counter in 32 bits
double cache_line_round_trip_ns(int cpu_a, int cpu_b, unsigned rounds, double limit_s);

}  // namespace probe
}  // namespace fastcopy
