// Measurements of the machine that benchmark reports print beside their figures. Nothing in
// the policy reads them.
#pragma once

namespace fastcopy {
namespace probe {

// Nanoseconds for one cache line to go from CPU `cpu_a` to CPU `cpu_b` and back: two threads
// pinned to those CPUs take turns writing one shared line, about `rounds` times, timed in
// blocks of 64 turns after a tenth as many of warm-up; the median block's mean. How far apart the two CPUs are: on the 2-vCPU Zen 3 KVM
// guest this flipped between about 110 ns and 450-520 ns as the host moved its vCPU
// threads, and a Channel moving 1 MiB messages between two processes ran at 20-25 GB/s in the
// first state and 5-8 GB/s in the second. Throws std::invalid_argument when a CPU is not in
// this process's affinity mask or cpu_a == cpu_b, std::runtime_error when a thread cannot be
// pinned or the turns stall for longer than `limit_s` (the other CPU is taken by something
// else). Linux only (elsewhere: std::runtime_error).
double cache_line_round_trip_ns(int cpu_a, int cpu_b, unsigned rounds, double limit_s);

}  // namespace probe
}  // namespace fastcopy
