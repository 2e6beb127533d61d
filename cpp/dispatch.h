// The dispatch policy: from CPU facts, size bands and addresses to one kernel.
// Everything that decides *which* kernel runs lives in dispatch.cpp; bindings only call
// copy_bytes() / copy_bytes_with().
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cpu.h"
#include "kernels/kernels.h"

namespace fastcopy {

// Where the bytes go. Copies into and out of memory shared between processes have their
// own policy entries (UCX tunes copy-in and copy-out separately, too).
enum class Region : int { Private = 0, ToShared = 1, FromShared = 2 };

struct KernelInfo {
    std::string name;          // "generic", "avx2", "avx2_nt", "erms", "neon", "sve"
    std::string description;   // one sentence for users
    CopyFn fn = nullptr;
    bool supported = false;    // usable on this CPU
    std::string why_not;       // empty when supported
};

// One row of the policy table, for info(): which kernel a size band gets and why.
struct PolicyRule {
    std::string region;        // "private", "to_shared", "from_shared"
    std::size_t min_bytes = 0; // inclusive
    std::size_t max_bytes = SIZE_MAX;  // exclusive; SIZE_MAX = no upper bound
    std::string kernel;        // kernel name, or "parallel(<kernel>)" for pool copies
    std::string reason;        // plain words, with the measurement behind it
};

struct Overrides {
    std::string kernel;          // FASTCOPY_KERNEL, empty = automatic
    std::string rep_movsb = "auto";  // FASTCOPY_REP_MOVSB: auto | on | off
    bool nt_threshold_set = false;   // FASTCOPY_NT_THRESHOLD given ("off" disables NT stores)
    std::size_t nt_threshold = 0;    // its value in bytes (SIZE_MAX for "off")
    int threads = -1;                // FASTCOPY_THREADS, -1 = not set
};

// Reads the FASTCOPY_* environment variables and builds the policy. Throws
// std::invalid_argument whose message names the variable, the bad value and the valid ones.
// Called once at import; calling again rebuilds the policy (tests use this).
void init_policy();

const std::vector<KernelInfo>& all_kernels();   // every kernel compiled into this build
const KernelInfo* find_kernel(const std::string& name);  // nullptr when not compiled in
const Overrides& overrides();
std::vector<PolicyRule> describe_policy();
// The policy another CPU would get (for tests of the rules on CPUs we do not have; the
// kernel functions named may not be supported here). Overrides are taken as given.
std::vector<PolicyRule> policy_for(const CpuFacts& facts, const Overrides& o);
// Plain-words notes on decisions that are not size bands (e.g. the SVE kernel-version rule).
std::vector<std::string> policy_notes();

std::size_t nt_threshold();        // bytes from which non-temporal stores are used
std::string nt_reason();           // why nt_threshold() is what it is, in words
std::size_t parallel_threshold();  // bytes from which the pool is used
std::string parallel_reason();     // the measurement behind parallel_threshold(), in words

// The kernel the policy picks for one contiguous copy.
CopyFn choose_kernel(void* dst, const void* src, std::size_t n, Region region);
// Name of a kernel function (for info and tests); "unknown" if not in the table.
const char* kernel_name(CopyFn fn);

// Copy n bytes with memmove semantics using the policy (and the thread pool for large,
// non-overlapping copies). Never touches Python; callers release the GIL around it.
void copy_bytes(void* dst, const void* src, std::size_t n, Region region = Region::Private);
// One piece of a transfer of `whole` bytes that is copied piece by piece (a message leaving
// a shared ring in 256 KiB steps): the non-temporal decision follows `whole` (the destination
// is that large), the rest of the policy follows n. No thread pool.
void copy_bytes_piece(void* dst, const void* src, std::size_t n, std::size_t whole, Region region);
// Same with one forced kernel for every size (fastcopy.kernel(name)); no thread pool.
void copy_bytes_with(CopyFn kernel, void* dst, const void* src, std::size_t n);

// Parses sizes like "4096", "64K", "8M", "1G", "512KiB" (binary units). Throws
// std::invalid_argument on anything else.
std::size_t parse_size(const std::string& text);

}  // namespace fastcopy
