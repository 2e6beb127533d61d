// The dispatch policy. One table of size bands per region, built once from the CPU facts
// and the FASTCOPY_* overrides; every rule states the measurement behind it (details and
// raw figures: docs/dispatch.md). Measurements "here" are from the development machines:
// AMD EPYC Zen 3 (family 25) under KVM, glibc 2.36 (../shared/notes/machines.md and our
// own benchmark runs).
#include "dispatch.h"

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>

#include "kernels/registry.h"
#include "pool.h"

namespace fastcopy {
namespace {

// Below this size the C library wins or ties: glibc 2.36 uses overlapping vector moves up
// to 2112 B (its rep movsb starts there), measured 17-19 GB/s at 64 B against 11-18 GB/s
// for our AVX2 loop, and 56-77 vs 62-76 GB/s at 1 KiB. Call overhead dominates anyway.
constexpr std::size_t kLibcMaxBytes = 2048;

// rep movsb collapses to 1.5-2.9 GB/s (from ~45) when (dst - src) mod 4096 is 1..31 on
// Zen 3 (4K aliasing); offsets >= 32 were fine. We keep a margin: never below 64.
constexpr std::size_t kRepMovsbMinPageDistance = 64;

// For CPUs we cannot measure (Intel with ERMS) we follow glibc's public thresholds: rep movsb
// from 2112 B with FSRM, else from 2048 * (32 / 16) = 4096 B with 32-byte vectors, up to the
// non-temporal threshold.
constexpr std::size_t kRepMovsbMinFsrm = 2112;
constexpr std::size_t kRepMovsbMinNoFsrm = 4096;

// PARALLEL THRESHOLD (measured by the pool benchmark, cpp/bench/bandwidth.cpp; see docs/threads.md)
// Intel Xeon KVM guest (2 vCPUs), 2 threads vs memcpy alone, paired medians of 3 runs: 256 KiB 0.91-1.01x, 512 KiB
// 1.02-1.18x hot but 0.43-0.68x with the worker asleep, 1 MiB 1.54-1.74x hot and 0.75-1.11x
// asleep, 2 MiB 1.84-2.30x hot and 1.04-1.43x asleep.
constexpr std::size_t kParallelMinBytes = std::size_t(1) << 20;
constexpr const char* kParallelReason =
    "two threads against one, measured on a 2-vCPU Intel Xeon VM: 0.91-1.01x at 256 KiB, 1.02-1.22x at 512 KiB (but 0.43-0.82x "
    "when the worker was asleep), 1.5-1.9x at 1 MiB back-to-back and 0.95x for an isolated copy (worker asleep), "
    "1.8-2.5x at 2-16 MiB";
// END PARALLEL THRESHOLD

struct Policy {
    CopyFn forced = nullptr;     // FASTCOPY_KERNEL
    // [0, small_max): always the C library (copy_generic).
    CopyFn mid = copy_generic;   // [small_max, nt_min)
    CopyFn nt = nullptr;         // [nt_min, inf), non-overlapping only
    std::size_t small_max = kLibcMaxBytes;
    std::size_t nt_min = SIZE_MAX;
    std::string nt_reason;
    // rep movsb window per region (index = Region); empty window = off.
    std::size_t erms_min[3] = {SIZE_MAX, SIZE_MAX, SIZE_MAX};
    std::size_t erms_max[3] = {0, 0, 0};
    std::string erms_reason[3];
    std::string mid_reason, small_reason;
    std::vector<std::string> notes;
};

Policy g_policy;
Overrides g_overrides;

std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

std::string size_words(std::size_t n) {
    if (n == SIZE_MAX) return "infinity";
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (u < 4 && n >= 1024 && n % 1024 == 0) { n /= 1024; ++u; }
    return std::to_string(n) + " " + units[u];
}

// The registry's kernels, each marked usable or not on this CPU.
std::vector<KernelInfo> build_kernel_table(const CpuFacts& f) {
    std::vector<KernelInfo> t;
    unsigned have = cpu_features(f);
    for (const KernelEntry& e : kernel_registry()) {
        unsigned missing = e.needs & ~have;
        t.push_back(KernelInfo{e.name, e.description, e.fn, missing == 0, missing_feature_words(missing)});
    }
    return t;
}

std::vector<KernelInfo>& kernel_table() {
    static std::vector<KernelInfo> table = build_kernel_table(cpu_facts());
    return table;
}

std::string usable_names() {
    std::string s;
    for (const auto& k : kernel_table())
        if (k.supported) s += (s.empty() ? "" : ", ") + k.name;
    return s;
}

const char* env(const char* name) {
    const char* v = std::getenv(name);
    return (v && *v) ? v : nullptr;
}

Overrides read_overrides() {
    Overrides o;
    if (const char* v = env("FASTCOPY_KERNEL")) {
        o.kernel = v;
        const KernelInfo* k = find_kernel(o.kernel);
        if (!k)
            throw std::invalid_argument("FASTCOPY_KERNEL='" + o.kernel +
                                        "' is not a kernel of this build; valid names here: " + usable_names());
        if (!k->supported)
            throw std::invalid_argument("FASTCOPY_KERNEL='" + o.kernel + "' is not supported on this CPU (" +
                                        k->why_not + "); valid names here: " + usable_names());
    }
    if (const char* v = env("FASTCOPY_REP_MOVSB")) {
        o.rep_movsb = lower(v);
        if (o.rep_movsb != "auto" && o.rep_movsb != "on" && o.rep_movsb != "off")
            throw std::invalid_argument(std::string("FASTCOPY_REP_MOVSB='") + v +
                                        "' is not valid; use auto, on or off");
    }
    if (const char* v = env("FASTCOPY_NT_THRESHOLD")) {
        o.nt_threshold_set = true;
        if (lower(v) == "off") {
            o.nt_threshold = SIZE_MAX;
        } else {
            try {
                o.nt_threshold = parse_size(v);
            } catch (const std::invalid_argument&) {
                throw std::invalid_argument(std::string("FASTCOPY_NT_THRESHOLD='") + v +
                                            "' is not a size; use bytes or a binary unit such as 64K, 8M, 1G, or off");
            }
        }
    }
    if (const char* v = env("FASTCOPY_THREADS")) {
        char* end = nullptr;
        long n = std::strtol(v, &end, 10);
        if (!end || *end != '\0' || n < 1 || n > 1024)
            throw std::invalid_argument(std::string("FASTCOPY_THREADS='") + v +
                                        "' is not valid; use a whole number from 1 (no threading) to 1024");
        o.threads = static_cast<int>(n);
    }
    return o;
}

// Non-temporal stores pay off once the copy no longer fits in the cache share we really
// get. Measured (single thread, NT loop vs glibc memcpy, medians of 9):
//  - AMD Zen 3 VM, 32 MiB L3 (sysfs): NT lost below a few MiB (20 vs 31-34 GB/s at 1 MiB)
//    and won up to 1.5x at 16-64 MiB (12-19 vs 7-13 GB/s at 16 MiB).
//  - Intel Xeon VM, sysfs and CPUID both claim a 480 MiB L3 (the host's, shared with other
//    tenants): NT lost 0.85-0.87x from 4 to 32 MiB and won 1.28x at 64 MiB, 1.15x at 128 MiB.
// Rule: half the L3, capped at 64 MiB. CPUID's L3 is not used when sysfs has one: under KVM
// on AMD it claims 256 MiB, which makes glibc start NT stores only at 192 MiB.
#if defined(FASTCOPY_X86)
constexpr std::size_t kNtCapBytes = std::size_t(64) << 20;

std::size_t default_nt_threshold(const CpuFacts& f, std::string& reason) {
    if (f.l3) {
        std::size_t half = f.l3 / 2;
        reason = "half the " + size_words(f.l3) + " L3 (from " + f.cache_source + ")";
        if (half > kNtCapBytes) reason += ", capped at 64 MiB (on a VM claiming a 480 MiB L3, NT stores won only from 64 MiB)";
        reason += "; measured on Zen 3: NT stores lose below a few MiB, win up to 1.5x at 16-64 MiB";
        if (f.l3_cpuid && f.l3_sysfs && f.l3_cpuid != f.l3_sysfs)
            reason += "; CPUID's " + size_words(f.l3_cpuid) + " L3 ignored (sysfs disagrees, e.g. under KVM)";
        return half < kNtCapBytes ? half : kNtCapBytes;
    }
    reason = "no L3 size known: 16 MiB default (half a typical 32 MiB L3)";
    return std::size_t(16) << 20;
}

#endif

Policy build_policy(const CpuFacts& f, const Overrides& o) {
    Policy p;
    if (!o.kernel.empty()) p.forced = find_kernel(o.kernel)->fn;
    p.small_reason = "the C library: glibc uses overlapping vector moves below 2112 B; on Zen 3 it ran 17-19 GB/s at 64 B "
                     "against 11-18 for an AVX2 loop";
    p.mid_reason = "the C library (no faster kernel compiled for this CPU)";
#if defined(FASTCOPY_X86)
    bool amd = f.vendor == "AuthenticAMD" || f.vendor == "HygonGenuine";
    if (f.avx2) {
        p.nt = copy_avx2_nt;
        p.nt_min = default_nt_threshold(f, p.nt_reason);
        if (amd) {
            p.mid = copy_avx2;
            p.mid_reason = "AVX2 loop: immune to the rep movsb 4K-aliasing collapse that glibc hits on Zen 3 from 2112 B "
                           "to 512 KiB ((dst - src) mod 4096 in 1..31: 1.5-2.9 GB/s instead of ~45); page-aligned 4 KiB "
                           "68-88 GB/s vs glibc 49-58 there";
        } else {
            // On Intel, glibc's memmove has EVEX/AVX-512 loops and guards its own rep movsb against
            // short distances; on an Intel Xeon VM here it ran 188 GB/s at 4 KiB page-aligned
            // against 141 for our AVX2 loop, so the C library keeps the band where rep movsb is not used.
            p.mid = copy_generic;
            p.mid_reason = "the C library: on Intel glibc's EVEX/AVX-512 loops beat our AVX2 loop (188 vs 141 GB/s at "
                           "4 KiB on an Intel Xeon VM)";
        }
    }
    // rep movsb: on by default only where it is known to win (Intel with ERMS); off on AMD,
    // where it is ~2x slower into and out of shared regions and 4K-aliases (see above).
    std::size_t erms_lo = f.fsrm ? kRepMovsbMinFsrm : kRepMovsbMinNoFsrm;
    for (int r = 0; r < 3; ++r) {
        bool shared = r != static_cast<int>(Region::Private);
        bool on = false;
        std::string why;
        if (o.rep_movsb == "off") {
            why = "rep movsb off: FASTCOPY_REP_MOVSB=off";
        } else if (amd && shared) {
            why = "rep movsb off: AMD opt-out for shared regions (about 2x slower there), even with FASTCOPY_REP_MOVSB=on";
        } else if (o.rep_movsb == "on") {
            on = true;
            why = "rep movsb on: FASTCOPY_REP_MOVSB=on (forward copies with (dst - src) mod 4096 >= 64)";
        } else if (amd) {
            why = "rep movsb off: AMD opt-out (4K-aliasing collapse, ~2x slower for shared regions)";
        } else if (!f.erms) {
            why = "rep movsb off: CPU lacks ERMS";
        } else {
            on = true;
            why = "rep movsb: Intel with ERMS, glibc's public thresholds (from 2112 B with FSRM, else 4096 B, "
                  "up to the non-temporal threshold); forward copies with (dst - src) mod 4096 >= 64";
        }
        if (on) {
            p.erms_min[r] = erms_lo < kLibcMaxBytes ? kLibcMaxBytes : erms_lo;
            p.erms_max[r] = p.nt_min;
            // glibc's own vector moves run up to where its rep movsb starts: keep the C library
            // for that band too, rather than a sliver of AVX2 between 2048 and 2112 B.
            if (r == static_cast<int>(Region::Private) && o.rep_movsb == "auto") p.small_max = p.erms_min[r];
        }
        p.erms_reason[r] = why;
    }
#endif
#if defined(FASTCOPY_ARM64)
    // NEON-only CPUs: glibc's aarch64 memcpy already uses 128-bit ASIMD pairs and per-core
    // variants; we cannot measure real ARM hardware here, so the C library stays in charge
    // and `neon` is available by name (FASTCOPY_KERNEL=neon) for users to compare.
    if (f.sve) {
        // A64FX field report: glibc without an SVE memcpy ran 9.6 GB/s at 4 KiB and 7.8 GB/s at
        // 256 MiB; an SVE loop reached 28.5 and 18.9 GB/s.
        std::size_t from = kLibcMaxBytes;
        std::string why = "SVE loop (" + std::to_string(f.sve_vector_bytes) +
                          "-byte vectors): on A64FX an SVE loop ran 28.5 GB/s vs glibc's 9.6 at 4 KiB, 18.9 vs 7.8 at 256 MiB";
        if (f.sve_traps_after_syscall) {
            // The first SVE instruction after each syscall traps to the kernel (Linux 4.15-6.1).
            // We estimate the trap at about 1 us (not measured here); from 256 KiB, at ~20 GB/s a
            // copy takes >= 13 us, so the trap costs under 10 %.
            from = std::size_t(256) << 10;
            why += "; only from 256 KiB because Linux " + std::to_string(f.kernel_major) + "." +
                   std::to_string(f.kernel_minor) + " traps on the first SVE instruction after each syscall";
            p.notes.push_back("SVE used only from 256 KiB: Linux " + std::to_string(f.kernel_major) + "." +
                              std::to_string(f.kernel_minor) +
                              " (4.15 to 6.1) discards SVE state at every syscall, so a trap (~1 us, estimated) "
                              "precedes the first SVE instruction after one");
        }
        p.mid = copy_sve;
        p.small_max = from;
        p.mid_reason = why;
    } else {
        p.mid_reason = "the C library: glibc's aarch64 memcpy already uses 128-bit ASIMD; no SVE on this CPU";
    }
#endif
    if (o.nt_threshold_set) {
        p.nt_min = p.nt ? o.nt_threshold : SIZE_MAX;
        p.nt_reason = o.nt_threshold == SIZE_MAX ? "FASTCOPY_NT_THRESHOLD=off" : "set by FASTCOPY_NT_THRESHOLD";
#if defined(FASTCOPY_X86)
        for (int r = 0; r < 3; ++r)
            if (p.erms_max[r]) p.erms_max[r] = p.nt_min;
#endif
    }
    if (p.nt_min < p.small_max) p.small_max = p.nt_min;
    if (p.nt && p.nt_min != SIZE_MAX)
        p.notes.push_back("a message leaving a shared-memory Channel is copied in 256 KiB pieces; they use " +
                          std::string(kernel_name(p.nt)) + " when the whole message is at least " +
                          size_words(p.nt_min) + " (measured: 9-10 GB/s against 4.7-5.3 with rep movsb at 64 MiB)");
    return p;
}

}  // namespace

std::size_t parse_size(const std::string& text) {
    std::string t = lower(text);
    while (!t.empty() && t.back() == ' ') t.pop_back();
    std::size_t pos = 0;
    while (pos < t.size() && std::isdigit(static_cast<unsigned char>(t[pos]))) ++pos;
    if (pos == 0 || pos > 19) throw std::invalid_argument("not a size: '" + text + "'");
    unsigned long long value = std::stoull(t.substr(0, pos));
    std::string unit = t.substr(pos);
    unsigned shift = 0;
    if (unit == "" || unit == "b") shift = 0;
    else if (unit == "k" || unit == "kb" || unit == "kib") shift = 10;
    else if (unit == "m" || unit == "mb" || unit == "mib") shift = 20;
    else if (unit == "g" || unit == "gb" || unit == "gib") shift = 30;
    else throw std::invalid_argument("not a size: '" + text + "'");
    if (shift && value > (~0ULL >> shift)) throw std::invalid_argument("size too large: '" + text + "'");
    return static_cast<std::size_t>(value << shift);
}

const std::vector<KernelInfo>& all_kernels() { return kernel_table(); }

const KernelInfo* find_kernel(const std::string& name) {
    for (const auto& k : kernel_table())
        if (k.name == name) return &k;
    return nullptr;
}

const char* kernel_name(CopyFn fn) {
    for (const auto& k : kernel_table())
        if (k.fn == fn) return k.name.c_str();
    return "unknown";
}

void init_policy() {
    Overrides o = read_overrides();  // throws before anything changes
    Policy p = build_policy(cpu_facts(), o);
    g_overrides = o;
    g_policy = p;
    pool::set_env_threads(o.threads > 0 ? static_cast<unsigned>(o.threads) : 0u);
}

const Overrides& overrides() { return g_overrides; }
std::size_t nt_threshold() { return g_policy.nt ? g_policy.nt_min : SIZE_MAX; }
std::size_t parallel_threshold() { return kParallelMinBytes; }
std::string parallel_reason() { return kParallelReason; }
std::string nt_reason() {
    return g_policy.nt ? g_policy.nt_reason : "no non-temporal kernel for this CPU";
}
std::vector<std::string> policy_notes() { return g_policy.notes; }

namespace {
// True when [dst, dst+n) and [src, src+n) share a byte.
bool ranges_overlap(const void* dst, const void* src, std::size_t n) {
    std::uintptr_t d = reinterpret_cast<std::uintptr_t>(dst), s = reinterpret_cast<std::uintptr_t>(src);
    return (d > s ? d - s : s - d) < n;
}
}  // namespace

CopyFn choose_kernel(void* dst, const void* src, std::size_t n, Region region) {
    const Policy& p = g_policy;
    if (p.forced) return p.forced;
    if (n < p.small_max) return copy_generic;
    bool overlap = ranges_overlap(dst, src, n);
    if (n >= p.nt_min && p.nt && !overlap) return p.nt;
#if defined(FASTCOPY_X86)
    std::uintptr_t d = reinterpret_cast<std::uintptr_t>(dst), s = reinterpret_cast<std::uintptr_t>(src);
    int r = static_cast<int>(region);
    bool backward = d > s && overlap;
    if (n >= p.erms_min[r] && n < p.erms_max[r] && !backward && ((d - s) & 4095) >= kRepMovsbMinPageDistance)
        return copy_erms;
#else
    (void)region;
#endif
    return p.mid;
}

void copy_bytes(void* dst, const void* src, std::size_t n, Region region) {
    CopyFn k = choose_kernel(dst, src, n, region);
    if (n >= kParallelMinBytes && !g_policy.forced && !ranges_overlap(dst, src, n) && pool::threads() > 1) {
        pool::parallel_copy(dst, src, n, k);
        return;
    }
    k(dst, src, n);
}

// Measured (shm helper, Intel VM): 256 KiB pieces from a hot ring into a 64 MiB destination
// ran 9.0-10.0 GB/s with avx2_nt against 4.7-5.3 GB/s with rep movsb.
void copy_bytes_piece(void* dst, const void* src, std::size_t n, std::size_t whole, Region region) {
    const Policy& p = g_policy;
    if (!p.forced && p.nt && whole >= p.nt_min && n >= kLibcMaxBytes && !ranges_overlap(dst, src, n)) {
        p.nt(dst, src, n);
        return;
    }
    choose_kernel(dst, src, n, region)(dst, src, n);
}

void copy_bytes_with(CopyFn kernel, void* dst, const void* src, std::size_t n) { kernel(dst, src, n); }

namespace {
std::vector<PolicyRule> describe(const Policy& p) {
    std::vector<PolicyRule> rules;
    const char* region_names[3] = {"private", "to_shared", "from_shared"};
    for (int r = 0; r < 3; ++r) {
        std::string region = region_names[r];
        if (p.forced) {
            rules.push_back({region, 0, SIZE_MAX, kernel_name(p.forced), "forced by FASTCOPY_KERNEL"});
            continue;
        }
        std::size_t mid_end = p.nt ? p.nt_min : SIZE_MAX;
        if (p.small_max > 0) rules.push_back({region, 0, p.small_max, "generic", p.small_reason});
        if (mid_end > p.small_max) {
#if defined(FASTCOPY_X86)
            if (p.erms_max[r] > p.erms_min[r]) {
                std::size_t lo = p.erms_min[r] < p.small_max ? p.small_max : p.erms_min[r];
                if (lo > p.small_max) rules.push_back({region, p.small_max, lo, kernel_name(p.mid), p.mid_reason});
                rules.push_back({region, lo, p.erms_max[r], "erms",
                                 p.erms_reason[r] + "; otherwise " + kernel_name(p.mid)});
            } else {
                rules.push_back({region, p.small_max, mid_end, kernel_name(p.mid),
                                 p.mid_reason + "; " + p.erms_reason[r]});
            }
#else
            rules.push_back({region, p.small_max, mid_end, kernel_name(p.mid), p.mid_reason});
#endif
        }
        if (p.nt && p.nt_min != SIZE_MAX)
            rules.push_back({region, p.nt_min, SIZE_MAX, kernel_name(p.nt),
                             "non-temporal stores from " + size_words(p.nt_min) + ": " + p.nt_reason +
                                 "; overlapping copies use " + kernel_name(p.mid)});
    }
    return rules;
}

}  // namespace

std::vector<PolicyRule> describe_policy() { return describe(g_policy); }

std::vector<PolicyRule> policy_for(const CpuFacts& facts, const Overrides& o) { return describe(build_policy(facts, o)); }

}  // namespace fastcopy
