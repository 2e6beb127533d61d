// Measurements of the machine that benchmark reports print beside their figures. Nothing in
// the policy reads them.
#pragma once

namespace fastcopy {
namespace probe {

// Nanoseconds for one cache line to go from CPU `cpu_a` to CPU `cpu_b` and back: two threads
// pinned to those CPUs take turns writing one shared line, about `rounds` times, timed in
// blocks of 64 turns after a tenth as many of warm-up; the median block's mean.
//
// It says how far apart the two CPUs are, which changes while a program runs under a
// hypervisor and decides how fast two processes share memory (evidence: cpu-probe-placement).
//
// Throws std::invalid_argument when a CPU is not in this process's affinity mask, cpu_a ==
// cpu_b, or rounds is outside 1..kMaxRounds; std::runtime_error when a thread cannot be pinned
// or the turns stall for longer than `limit_s` (the other CPU is taken by something else).
// Linux only (elsewhere: std::runtime_error).
constexpr unsigned kMaxRounds = 1u << 24;  // about 8 s at 500 ns; keeps the turn counter in 32 bits
double cache_line_round_trip_ns(int cpu_a, int cpu_b, unsigned rounds, double limit_s);

}  // namespace probe
}  // namespace fastcopy
