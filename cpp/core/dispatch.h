// The façade the bindings, the shared-memory ring and the benchmarks call: kernels by name,
// the active dispatch profile (cpp/policy/), and copy_bytes(). Which kernel runs is decided by
// policy::choose() on the active profile; nothing here knows about vendors.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cpu.h"
#include "kernels/kernels.h"
#include "policy/profile.h"

namespace fastcopy::policy {
class StoreModeLearner;
class SplitLearner;
}

namespace fastcopy {

struct KernelInfo {
    std::string name;          // "generic", "avx2", "avx2_nt", "erms", "neon", "sve"
    std::string description;   // one sentence for users
    CopyFn fn = nullptr;
    bool supported = false;    // usable on this CPU
    std::string why_not;       // empty when supported
};

using Overrides = policy::Overrides;
using policy::parse_size;

// Reads the FASTCOPY_* environment variables and applies them on top of the current base
// profile (the built-in one for this CPU until load_profile()). Throws std::invalid_argument
// whose message names the variable, the bad value and the valid ones; nothing changes then.
// Called once at import; calling again rebuilds the active profile (tests use this).
void init_policy();

// Parses, validates and activates a profile (JSON text, docs/profile-format.md); the
// overrides in force are applied on top. Throws std::invalid_argument naming the problem; the
// active profile is unchanged then.
void load_profile(const std::string& json_text, const std::string& source);
// Goes back to the built-in profile for this CPU (overrides still applied); with a name, that
// built-in profile resolved for this CPU (tests of other CPUs' tables; std::invalid_argument
// for an unknown name).
void use_builtin_profile(const std::string& name = "");
// The profile every copy executes now (overrides included). Valid until the next
// init_policy/load_profile/use_builtin_profile; replaced profiles are kept alive, so a copy
// running in another thread never sees freed memory.
const policy::Profile& active_profile();
// The base profile (before the overrides).
const policy::Profile& base_profile();

const std::vector<KernelInfo>& all_kernels();   // every kernel compiled into this build
const KernelInfo* find_kernel(const std::string& name);  // nullptr when not compiled in
const Overrides& overrides();
std::vector<std::string> policy_notes();

std::size_t nt_threshold();        // private region: bytes from which non-temporal stores are used
std::string nt_reason();
std::size_t parallel_threshold();  // bytes from which the pool is used (SIZE_MAX: never)
std::string parallel_reason();

// The kernel the active profile picks for one contiguous copy.
CopyFn choose_kernel(void* dst, const void* src, std::size_t n, Region region);
// The kernel a private copy of these addresses runs now, outside a trial: choose_kernel's,
// or for copies that learn their store mode (nt.learn_from) the band's or the NT kernel, as
// private_store_modes() has settled. Changes nothing.
CopyFn learned_kernel(void* dst, const void* src, std::size_t n);
// Whether a private copy of these addresses runs split across the thread pool now, outside a
// trial: from the profile's parallel threshold, as private_split_modes() has settled for the
// sizes it learns. Changes nothing.
bool learned_split(void* dst, const void* src, std::size_t n);
// Whether a copy of these addresses goes to the thread pool under profile p (its threshold for
// the region: policy::pool_threshold; more than one thread set, no forced kernel, no overlap),
// before any learning.
bool goes_to_pool(const policy::Profile& p, const void* dst, const void* src, std::size_t n,
                  Region region = Region::Private);
// Name of a kernel function (for info and tests); "unknown" if not in the table.
const char* kernel_name(CopyFn fn);

// Copy n bytes with memmove semantics using the policy (and the thread pool for large,
// non-overlapping copies). Never touches Python; callers release the GIL around it.
void copy_bytes(void* dst, const void* src, std::size_t n, Region region = Region::Private);
// copy_bytes() of n bytes in steps of `step` bytes, with the kernel and the thread pool chosen
// once for the whole n (so the steps run what one call would). After each step but the last it
// calls stop(ctx) and ends the copy there when that returns true. Returns the bytes copied (n
// when it ran to the end). Overlapping ranges are copied in one step: memmove semantics need
// the whole range at once.
std::size_t copy_bytes_in_steps(void* dst, const void* src, std::size_t n, Region region, std::size_t step,
                                bool (*stop)(void* ctx), void* ctx);
// A write of n bytes into shared memory that another process reads (a loan filled by copy()):
// the ToShared policy, with cached or streaming stores as `mode` decides from the measured
// speed of earlier writes (policy/store_modes.h). Without a mode, below its minimum size, or
// with a forced kernel: copy_bytes(..., Region::ToShared).
void copy_bytes_to_shared(void* dst, const void* src, std::size_t n, policy::StoreModeLearner* mode);
// One piece of a transfer of `whole` bytes that is copied piece by piece (a message leaving
// a shared ring in 256 KiB steps): the non-temporal decision follows `whole` (the destination
// is that large), the rest of the policy follows n. No thread pool.
void copy_bytes_piece(void* dst, const void* src, std::size_t n, std::size_t whole, Region region);
// Same with one forced kernel for every size (fastcopy.kernel(name)); no thread pool.
void copy_bytes_with(CopyFn kernel, void* dst, const void* src, std::size_t n);

// Kernel identity hook: the kernel the calling thread last ran through copy_bytes*,
// (nullptr after reset_last_kernel()). Tests read it to prove a forced kernel really runs.
CopyFn last_kernel();
// The store modes private copies learn from the profile's nt.learn_from up to its NT threshold
// (copy_bytes; policy/store_modes.h): what they measured, for info() and tests.
policy::StoreModeLearner& private_store_modes();
// Split or alone for private copies the profile splits across the pool, below nt.learn_from
// (copy_bytes; policy/split_modes.h): what they measured, for info() and tests.
policy::SplitLearner& private_split_modes();
void reset_last_kernel();

}  // namespace fastcopy
