// The dispatch policy as data: a Profile says, per region and address class, which kernel
// each size band gets, plus the non-temporal and thread-pool rules and where the numbers
// came from. Built-in profiles (defaults.cpp), tuned files (profile_io.cpp, format in
// docs/profile-format.md) and the FASTCOPY_* overrides (overrides.cpp) all produce one;
// select.cpp executes it. info() prints the active Profile as it is: what you see is what runs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../cpu.h"
#include "../kernels/kernels.h"

namespace fastcopy {

// Where the bytes go. Copies into and out of memory shared between processes have their
// own policy entries (UCX tunes copy-in and copy-out separately, too).
enum class Region : int { Private = 0, ToShared = 1, FromShared = 2 };

namespace policy {

constexpr int kRegions = 3;
constexpr int kClasses = 4;
constexpr std::size_t kMaxBands = 64;        // per class (docs/profile-format.md)
constexpr std::size_t kMaxWhyChars = 500;    // per free-text field
constexpr std::size_t kMaxFileBytes = 1 << 20;
constexpr std::size_t kMaxSizeValue = std::size_t(1) << 40;  // 1 TiB: larger thresholds are absurd
constexpr std::size_t kMinNtThreshold = 4096;
constexpr std::size_t kMinParallelThreshold = 65536;
constexpr std::size_t kMinNtLearnFrom = 256 << 10;  // nt.learn_from: StoreModeLearner::kMinBytes
constexpr std::size_t kMinSplitLearnFrom = 256 << 10;  // parallel.learn_from: SplitLearner::kMinBytes
constexpr unsigned kMaxThreads = 1024;
constexpr std::size_t kMaxNotes = 32;
constexpr std::size_t kMaxNameChars = 100;
constexpr std::size_t kMaxPageDistance = 4096;  // nt.min_page_distance: 0..this
constexpr int kMaxJsonDepth = 32;                 // nesting of a profile's JSON
// glibc's rep movsb threshold on x86-64 with FSRM: where FASTCOPY_REP_MOVSB=on puts rep movsb
// in a region whose profile does not say (rep_movsb_on).
constexpr std::size_t kGlibcRepMovsbFrom = 2112;
constexpr const char* kProfileFormat = "fastcopy-profile";
constexpr unsigned kProfileVersion = 1;

// Decided in this order: Backward when the ranges overlap with dst > src; otherwise by
// (dst - src) mod 4096: 0 PageAligned, 1..63 Near, >= 64 Far.
enum class AddressClass : int { PageAligned = 0, Near = 1, Far = 2, Backward = 3 };

// The address-class rule in one place (the comment above): the page distance, the near
// bound, and the class of one contiguous copy of n bytes.
constexpr std::uintptr_t kAddressPageBytes = 4096;
constexpr std::uintptr_t kNearDistanceBelow = 64;  // distances 1..63 are Near
// (dst - src) mod 4096; unsigned wrap-around gives the distance either way.
inline std::uintptr_t page_distance(const void* dst, const void* src) {
    return (reinterpret_cast<std::uintptr_t>(dst) - reinterpret_cast<std::uintptr_t>(src)) & (kAddressPageBytes - 1);
}
inline AddressClass address_class(const void* dst, const void* src, std::size_t n) {
    const std::uintptr_t d = reinterpret_cast<std::uintptr_t>(dst), s = reinterpret_cast<std::uintptr_t>(src);
    if (d > s && d - s < n) return AddressClass::Backward;
    const std::uintptr_t off = page_distance(dst, src);
    if (off == 0) return AddressClass::PageAligned;
    return off < kNearDistanceBelow ? AddressClass::Near : AddressClass::Far;
}

const char* region_key(int region);  // "private", "to_shared", "from_shared"
const char* class_key(int cls);      // "page_aligned", "near", "far", "backward"

struct Band {
    std::size_t from = 0;        // inclusive; the band runs up to the next band's `from`
    CopyFn fn = nullptr;         // nullptr only for kernels not compiled into this build (tests of other CPUs)
    const char* kernel = "";     // interned kernel name (lives as long as the process)
    std::string why;
};

struct NtRule {
    std::size_t threshold = SIZE_MAX;  // SIZE_MAX: never
    CopyFn fn = nullptr;
    const char* kernel = nullptr;      // nullptr when threshold is SIZE_MAX
    std::string why;
    // Non-temporal stores only when (dst - src) mod 4096 is 0 or at least this: at smaller
    // distances the loads 4K-alias the streaming stores still in flight (evidence:
    // zen3-nt-page-distance, zen4-nt-page-distance). 0: every distance.
    std::size_t min_page_distance = 0;
    // The guard above covers copies below this size only; from it on, every distance streams:
    // split over the pool, large streamed copies win at small distances too (evidence:
    // zen4-nt-page-distance). SIZE_MAX: every size.
    std::size_t min_page_distance_below = SIZE_MAX;
    // From this size, copies without overlap time themselves and use cached stores (the
    // band's kernel) or this rule's kernel, whichever ran faster lately (StoreModeLearner,
    // kPrivateCopyRule), copies the rule streams as well as those it does not (below the
    // threshold, or at a page distance the guard excludes); a size class starts in the mode
    // the rule gives its first copy. Cached stores win while the buffers sit in the last-level
    // cache, streaming ones while they do not (evidence: policy-private-store-modes). Private
    // region only; SIZE_MAX: off.
    std::size_t learn_from = SIZE_MAX;
};
// True when the NT rule applies to this copy (size, no overlap, page distance).
inline bool nt_applies(const NtRule& nt, const void* dst, const void* src, std::size_t n);

struct RegionRules {
    std::vector<Band> cls[kClasses];
    NtRule nt;
    // Where FASTCOPY_REP_MOVSB=on puts rep movsb: the far class from this size up to the NT
    // threshold. SIZE_MAX: not in this region, even when asked (AMD shared-memory opt-out).
    // Never the near class (4K aliasing) nor backward copies.
    std::size_t erms_on_request = kGlibcRepMovsbFrom;
    std::string erms_on_request_why;
};

struct ParallelRule {
    std::size_t threshold = SIZE_MAX;  // SIZE_MAX: never
    unsigned threads = 0;              // 0: every usable CPU (pool default), else 1..1024
    std::string why;
    // From this size (below the private NT rule's learn_from) private copies on the pool time
    // themselves and run split or on the caller alone, whichever ran faster lately
    // (split_modes.h); SIZE_MAX: they always split.
    std::size_t learn_from = kMinSplitLearnFrom;
    // Copies into and out of shared memory go to the pool from this size or `threshold`,
    // whichever is larger (pool_threshold()); 0: from `threshold`; SIZE_MAX: never. A peer
    // process runs on the other CPUs there, and those copies do not learn split or alone.
    std::size_t shared_from = 0;
};

// The smallest sizes of a region, where every address class (and no NT rule) gives the same
// kernel for each size: up to kUniformBands bands shared by all classes, below `below`.
// choose_inline() picks among them with three compares and no branch, skipping the address
// class and the band search (evidence: policy-uniform-small-sizes).
constexpr int kUniformBands = 4;
struct UniformBands {
    std::size_t below = 0;  // 0: no size is uniform
    // Ascending; from[0] is 0 and an unused entry is SIZE_MAX, so it never counts.
    std::size_t from[kUniformBands] = {0, SIZE_MAX, SIZE_MAX, SIZE_MAX};
    CopyFn fn[kUniformBands] = {nullptr, nullptr, nullptr, nullptr};
    const char* kernel[kUniformBands] = {nullptr, nullptr, nullptr, nullptr};
};

struct Provenance {
    std::string machine, date, libc, method;
};

struct Profile {
    std::string name;          // "amd-zen4", "tuned", ...
    std::string source;        // "built-in" or the file it was read from
    std::string matched_why;   // built-in: why this profile matched this CPU
    Provenance provenance;
    std::string signature_json;  // tuned profiles: the measuring machine's signature (compact JSON), else ""
    RegionRules region[kRegions];
    ParallelRule parallel;
    std::vector<std::string> notes;      // decisions that are not bands, in words
    std::vector<std::string> overrides;  // FASTCOPY_* edits applied on top, in words

    CopyFn forced = nullptr;             // FASTCOPY_KERNEL
    const char* forced_kernel = nullptr;

    // Derived by finalize(): the sizes where a region's choice does not depend on the addresses.
    UniformBands uniform[kRegions];
};

// Recomputes the derived fields; merges adjacent bands naming the same kernel.
void finalize(Profile& p);

// ---- select.cpp ----------------------------------------------------------------------
struct Choice {
    CopyFn fn;
    const char* kernel;
};
AddressClass classify(const void* dst, const void* src, std::size_t n);
// The kernel a profile gives one contiguous copy: forced kernel, else the NT rule (no
// overlap, n >= threshold), else the band of the address class. A few branches and a lookup.
Choice choose(const Profile& p, const void* dst, const void* src, std::size_t n, Region region);
// True when [dst, dst+n) and [src, src+n) share a byte.
inline bool ranges_overlap(const void* dst, const void* src, std::size_t n) {
    std::uintptr_t d = reinterpret_cast<std::uintptr_t>(dst), s = reinterpret_cast<std::uintptr_t>(src);
    return (d > s ? d - s : s - d) < n;
}

inline bool nt_applies(const NtRule& nt, const void* dst, const void* src, std::size_t n) {
    if (n < nt.threshold || ranges_overlap(dst, src, n)) return false;
    std::uintptr_t off = (reinterpret_cast<std::uintptr_t>(dst) - reinterpret_cast<std::uintptr_t>(src)) & 4095;
    return off == 0 || off >= nt.min_page_distance || n >= nt.min_page_distance_below;
}

// The size from which a copy of `region` goes to the thread pool (SIZE_MAX: never): the
// parallel threshold, and for copies into and out of shared memory the larger of it and
// parallel.shared_from.
inline std::size_t pool_threshold(const Profile& p, Region region) {
    if (region == Region::Private) return p.parallel.threshold;
    return p.parallel.threshold > p.parallel.shared_from ? p.parallel.threshold : p.parallel.shared_from;
}

// ---- kernels as the policy sees them (registry + CPU facts) ---------------------------
struct KernelFacts {
    const char* name = nullptr;  // interned
    CopyFn fn = nullptr;
    bool compiled = false;       // in this build's registry
    bool usable = false;         // compiled and the CPU has what it needs
    bool streaming = false;
    std::string why_not;         // empty when usable
};
KernelFacts kernel_facts(const std::string& name, const CpuFacts& cpu);
// True when this build's registry has a kernel of that name.
bool kernel_in_build(const std::string& name);
// Interned copy of a kernel name (stable pointer for the life of the process).
const char* intern_kernel_name(const std::string& name);
// "generic, avx2, ..." usable on this CPU.
std::string usable_kernel_names(const CpuFacts& cpu);

// ---- defaults.cpp: built-in profiles ---------------------------------------------------
struct BuiltinInfo {
    std::string name;
    std::string match;        // the match rule in words
    bool matches = false;     // for the given CPU
    int specificity = -1;     // higher wins; -1 when it does not match
};
// The most specific built-in profile matching these facts, resolved against them (kernels the
// CPU lacks fall back per band, saying so in the band's why).
Profile builtin_profile(const CpuFacts& cpu);
// A built-in profile by name, resolved against these facts; throws std::invalid_argument
// for an unknown name.
Profile builtin_profile_named(const std::string& name, const CpuFacts& cpu);
std::vector<BuiltinInfo> builtin_profiles(const CpuFacts& cpu);

// The built-in profiles as defaults.cpp writes them, not resolved against any CPU: what the
// generated reference (docs/reference/builtin-profiles.md) shows.
struct BuiltinBandSpec {
    std::size_t from = 0;
    std::string kernel;
    std::string fallback;  // the kernel used when `kernel` is missing from the build or the CPU
    std::string why;
};
struct BuiltinRegionSpec {
    std::vector<BuiltinBandSpec> cls[kClasses];
    std::size_t erms_on_request = SIZE_MAX;  // SIZE_MAX: FASTCOPY_REP_MOVSB=on does not reach it
    std::string erms_on_request_why;
};
struct NtExample {
    std::size_t l3 = 0;                // the L3 size the CPU reports (0: unknown)
    std::size_t threshold = SIZE_MAX;  // SIZE_MAX: never
    std::string why;
};
struct BuiltinTable {
    std::string name;
    std::string match;  // the match rule in words
    int rank = 0;       // the specificity when it matches: the highest-ranked matching profile wins
    Provenance provenance;
    BuiltinRegionSpec region[kRegions];
    std::string nt_kernel;  // "": no non-temporal stores
    std::size_t nt_min_page_distance = 0;
    std::size_t nt_min_page_distance_below = SIZE_MAX;  // in the private region (NtRule::min_page_distance_below)
    std::size_t nt_learn_from = SIZE_MAX;  // in the private region (NtRule::learn_from)
    std::vector<NtExample> nt_examples;  // the NT threshold for a few L3 sizes
    std::vector<NtExample> shared_nt_examples;  // the same for copies into and out of shared memory
    std::size_t parallel_from = SIZE_MAX;
    std::string parallel_why;
    std::size_t split_learn_from = kMinSplitLearnFrom;  // ParallelRule::learn_from
    std::size_t parallel_shared_from = SIZE_MAX;  // ParallelRule::shared_from
    std::size_t sve_trap_min_from = 0;  // SVE bands start no lower than this where Linux traps SVE (0: no rule)
    std::vector<std::string> notes;
};
std::vector<BuiltinTable> builtin_tables();
// How a CPU's built-in profile is chosen, in words.
std::string builtin_match_rule();

// ---- profile_io.cpp: JSON -------------------------------------------------------------
// Parses and validates a profile (docs/profile-format.md) against this CPU. Throws
// std::invalid_argument whose message names the problem (and the JSON path), never crashes,
// never returns a profile naming a kernel the CPU lacks.
Profile parse_profile(const std::string& json_text, const std::string& source, const CpuFacts& cpu);
// The profile as JSON in the same format (overrides not included: they are edits made at
// run time; `forced` is reported by info() separately).
std::string to_json(const Profile& p);
// The "signature" object of a profile text as compact JSON ("" when absent); throws like
// parse_profile on bad JSON.
std::string signature_of(const std::string& json_text);
// The signature's members as (key, compact JSON of the value), in file order; empty when the
// profile has none. Throws like parse_profile on bad JSON.
std::vector<std::pair<std::string, std::string>> signature_fields(const std::string& json_text);
// Any JSON text (at most kMaxFileBytes) as compact JSON: no spaces, members in their order,
// strings escaped as the writer escapes them. Throws like parse_profile on bad JSON.
std::string compact_json(const std::string& json_text);

// ---- overrides.cpp ------------------------------------------------------------------
struct Overrides {
    std::string kernel;              // FASTCOPY_KERNEL, empty = automatic
    std::string rep_movsb = "auto";  // FASTCOPY_REP_MOVSB: auto | on | off
    bool nt_threshold_set = false;   // FASTCOPY_NT_THRESHOLD given ("off" disables NT stores)
    std::size_t nt_threshold = 0;    // its value in bytes (SIZE_MAX for "off")
    int threads = -1;                // FASTCOPY_THREADS, -1 = not set
    bool nt_learn_from_set = false;  // FASTCOPY_NT_LEARN_FROM given ("off" turns the learning off)
    std::size_t nt_learn_from = 0;   // its value in bytes (SIZE_MAX for "off")
    bool split_learn_from_set = false;  // FASTCOPY_SPLIT_LEARN_FROM given ("off": always split)
    std::size_t split_learn_from = 0;   // its value in bytes (SIZE_MAX for "off")
};
// Reads the FASTCOPY_* variables. Throws std::invalid_argument naming the variable, the bad
// value and the valid ones.
Overrides read_overrides(const CpuFacts& cpu);
// Edits a profile: FASTCOPY_KERNEL forces one kernel; FASTCOPY_REP_MOVSB=off replaces every
// rep movsb band with the C library, =on adds rep movsb to the far class where the region
// allows it (never near, never backward); FASTCOPY_NT_THRESHOLD moves (or removes) the NT rule;
// FASTCOPY_NT_LEARN_FROM moves (or removes) the private region's nt.learn_from.
void apply_overrides(Profile& p, const Overrides& o, const CpuFacts& cpu);
// Every FASTCOPY_* variable read_overrides() reads: what it does and the values it accepts.
struct OverrideVariable {
    std::string name;
    std::string values;  // the values accepted, in words (the error for a bad value lists them)
    std::string effect;
    std::string default_value;
    long long min = 0, max = -1;  // the bounds of its number (max < min: none)
};
const std::vector<OverrideVariable>& override_variables();
// How every FASTCOPY_* variable is read (whitespace, empty values), in words.
const char* override_reading_rule();

// Parses sizes like "4096", "64K", "8M", "1G", "512KiB" (binary units). Throws
// std::invalid_argument on anything else.
std::size_t parse_size(const std::string& text);
std::string size_words(std::size_t n);  // "64 KiB", "infinity"

}  // namespace policy
}  // namespace fastcopy
