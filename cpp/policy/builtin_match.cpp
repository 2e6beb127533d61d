// Matching the built-in profiles to a CPU and resolving one into a Profile. The most specific
// matching profile wins (model range, then family, then vendor, then required features).
// Thresholds that depend on the machine's caches (the non-temporal threshold) and on the
// Linux version (the SVE trap rule) are computed from the CPU facts when a profile is resolved,
// and their reasons say so.
#include <algorithm>
#include <stdexcept>

#include "builtin_spec.h"
#include "profile.h"

namespace fastcopy {
namespace policy {
namespace {

using namespace builtin;

bool has(const CpuFacts& f, unsigned needs) {
    if ((needs & kMatchAvx2) && !f.avx2) return false;
    if ((needs & kMatchAvx512) && !(f.avx512f && f.avx512bw && f.avx512vl)) return false;
    if ((needs & kMatchSve) && !f.sve) return false;
    if ((needs & kMatchErms) && !f.erms) return false;
    return true;
}

std::string needs_words(unsigned needs) {
    std::string s;
    auto add = [&](unsigned bit, const char* w) {
        if (needs & bit) s += (s.empty() ? "" : "+") + std::string(w);
    };
    add(kMatchAvx2, "AVX2");
    add(kMatchAvx512, "AVX-512");
    add(kMatchSve, "SVE");
    add(kMatchErms, "ERMS");
    return s;
}

std::string match_words(const Spec& s) {
    std::string w = s.arch ? s.arch : "any architecture";
    if (!s.vendors.empty()) {
        w += ", vendor ";
        for (std::size_t i = 0; i < s.vendors.size(); ++i) w += (i ? " or " : "") + std::string(s.vendors[i]);
    }
    if (s.family >= 0) w += ", family " + std::to_string(s.family);
    if (s.model_lo >= 0) w += ", model " + std::to_string(s.model_lo) + "-" + std::to_string(s.model_hi);
    if (s.needs) w += ", with " + needs_words(s.needs);
    return w;
}

// The specificity of a profile that matches: the most specific match wins.
constexpr int kRankModel = 10000, kRankFamily = 1000, kRankVendor = 100, kRankFeature = 10, kRankArch = 1;
int rank(const Spec& s) {
    int score = (s.arch ? kRankArch : 0) + (s.model_lo >= 0 ? kRankModel : 0) + (s.family >= 0 ? kRankFamily : 0) +
                (s.vendors.empty() ? 0 : kRankVendor);
    for (unsigned b = s.needs; b; b &= b - 1) score += kRankFeature;
    return score;
}

int specificity(const Spec& s, const CpuFacts& f) {
    if (s.arch && f.arch != s.arch) return -1;
    if (!s.vendors.empty() &&
        std::none_of(s.vendors.begin(), s.vendors.end(), [&](const char* v) { return f.vendor == v; }))
        return -1;
    if (s.family >= 0 && static_cast<int>(f.family) != s.family) return -1;
    if (s.model_lo >= 0 && (static_cast<int>(f.model) < s.model_lo || static_cast<int>(f.model) > s.model_hi))
        return -1;
    if (!has(f, s.needs)) return -1;
    return rank(s);
}

Band resolve_band(const BandSpec& b, const CpuFacts& cpu) {
    KernelFacts k = kernel_facts(b.kernel, cpu);
    Band out;
    out.from = b.from;
    out.why = b.why;
    if (k.usable && !k.streaming) {
        out.fn = k.fn;
        out.kernel = k.name;
        return out;
    }
    const char* fb = b.fallback ? b.fallback : "generic";
    KernelFacts f = kernel_facts(fb, cpu);
    if (!f.usable || f.streaming) {  // the fallback is missing too: the C library runs everywhere
        fb = "generic";
        f = kernel_facts(fb, cpu);
    }
    out.fn = f.fn;
    out.kernel = f.name;
    out.why = std::string(fb) + " in place of " + b.kernel + " (" + (k.compiled ? k.why_not : "not in this build") +
              "); the table's reason for " + b.kernel + ": " + b.why;
    return out;
}

void nt_threshold_for(NtKind kind, const CpuFacts& f, std::size_t& threshold, std::string& why) {
    if (kind == NtKind::HalfL3Cap64M) {
        // Non-temporal stores pay off once the copy no longer fits in the cache share this CPU
        // really gets: half the L3 (evidence: zen3-nt-half-l3, zen4-nt-half-l3), capped at
        // 64 MiB because a VM may report the host's L3 (evidence: intel-nt-cap-64mib). CPUID's L3
        // is not used when sysfs has one (evidence: cpu-kvm-l3-cpuid).
        constexpr std::size_t cap = 64 * MiB;
        if (f.l3) {
            std::size_t half = f.l3 / 2;
            why = "half the " + size_words(f.l3) + " L3 (from " + f.cache_source + ")";
            if (half > cap)
                why += ", capped at 64 MiB: NT stores already win there where a VM reports the host's L3 (evidence: "
                       "intel-nt-cap-64mib)";
            why += "; NT stores lose while the copy fits that share and win above it (evidence: zen3-nt-half-l3, "
                   "zen4-nt-half-l3)";
            if (f.l3_cpuid && f.l3_sysfs && f.l3_cpuid != f.l3_sysfs)
                why += "; CPUID's " + size_words(f.l3_cpuid) + " L3 ignored (sysfs disagrees, e.g. under KVM)";
            threshold = half < cap ? half : cap;
        } else {
            why = "no L3 size known: 16 MiB default (half a typical 32 MiB L3)";
            threshold = 16 * MiB;
        }
    } else if (kind == NtKind::HalfL3Cap12M) {
        // Intel with AVX-512 (evidence: intel-nt-threshold): with the default two threads the pool
        // with avx512_nt tied parallel rep movsb at 8 MiB and won from 12 MiB.
        constexpr std::size_t cap = 12 * MiB;
        std::size_t half = f.l3 ? f.l3 / 2 : cap;
        threshold = std::min(half, cap);
        why = (f.l3 ? "half the " + size_words(f.l3) + " L3 (from " + f.cache_source + "), at most 12 MiB"
                    : std::string("12 MiB (no L3 size known)")) +
              ": on a 2-vCPU Intel Xeon VM (Sapphire Rapids class) the pool with avx512_nt ran "
              "0.91-0.94x the pool without NT stores at 4 MiB, 1.00-1.04x at 8 MiB, 1.07-1.18x at 12 MiB, 1.15-1.19x at "
              "16 MiB and 1.34-1.65x at 24-32 MiB; one thread alone 0.94-0.96x glibc at 8-16 MiB (evidence: "
              "intel-nt-threshold)";
    } else if (kind == NtKind::TwiceL3) {
        // On Zen 5 NT stores lose at half the L3 and win at twice it (evidence: zen5-nt-twice-l3).
        constexpr std::size_t cap = 256 * MiB;
        std::size_t l3 = f.l3 ? f.l3 : 32 * MiB;
        threshold = std::min(2 * l3, cap);
        why = "twice the " + size_words(l3) + " L3" + (f.l3 ? " (from " + f.cache_source + ")" : " (L3 unknown: 32 MiB assumed)") +
              ": on Zen 5 NT stores lose at half the L3 and win at twice it (evidence: zen5-nt-twice-l3)";
    } else {
        threshold = SIZE_MAX;
        why = "no non-temporal rule for this CPU";
    }
}

// The NT threshold of region `r` of `s` for this CPU: the shared-memory rule where the table
// has one of its own.
void nt_threshold_for(const Spec& s, int r, const CpuFacts& f, std::size_t& threshold, std::string& why) {
    const bool shared = r != static_cast<int>(Region::Private) && s.shared_nt != NtKind::Inherit;
    nt_threshold_for(shared ? s.shared_nt : s.nt, f, threshold, why);
    if (shared && s.shared_nt_why) why = std::string(s.shared_nt_why) + ": " + why;
}

Profile resolve(const Spec& s, const CpuFacts& cpu, int score) {
    Profile p;
    p.name = s.name;
    p.source = "built-in";
    p.matched_why = score >= 0 ? "matched this CPU (" + cpu.vendor + " family " + std::to_string(cpu.family) +
                                     " model " + std::to_string(cpu.model) + ") by: " + match_words(s)
                               : "not the match for this CPU (requested by name): " + match_words(s);
    p.provenance = s.provenance;
    for (int r = 0; r < kRegions; ++r) {
        std::size_t nt = SIZE_MAX;
        std::string nt_why;
        nt_threshold_for(s, r, cpu, nt, nt_why);
        const RegionSpec& rs = s.regions[r];
        const ClassSpec* classes[kClasses] = {&rs.page_aligned, &rs.near, &rs.far, &rs.backward};
        RegionRules& out = p.region[r];
        for (int c = 0; c < kClasses; ++c) {
            for (const BandSpec& b : *classes[c]) {
                Band band = resolve_band(b, cpu);
                if (s.sve_trap_min_from && cpu.sve_traps_after_syscall && std::string(band.kernel) == "sve" &&
                    band.from < s.sve_trap_min_from) {
                    out.cls[c].push_back({band.from, kernel_facts("generic", cpu).fn, kernel_facts("generic", cpu).name,
                                          "the C library below 256 KiB: Linux " + std::to_string(cpu.kernel_major) +
                                              "." + std::to_string(cpu.kernel_minor) +
                                              " traps on the first SVE instruction after each syscall"});
                    band.from = s.sve_trap_min_from;
                    band.why += "; only from 256 KiB because Linux " + std::to_string(cpu.kernel_major) + "." +
                                std::to_string(cpu.kernel_minor) + " traps on the first SVE instruction after each syscall";
                }
                out.cls[c].push_back(band);
            }
        }
        out.erms_on_request = rs.erms_on_request;
        out.erms_on_request_why = rs.erms_on_request_why ? rs.erms_on_request_why : "";
        if (s.nt_kernel && nt != SIZE_MAX) {
            KernelFacts k = kernel_facts(s.nt_kernel, cpu);
            if (k.usable && k.streaming) {
                const bool priv = r == static_cast<int>(Region::Private);
                out.nt = {nt, k.fn, k.name, nt_why, s.nt_min_page_distance,
                          priv ? s.nt_min_page_distance_below : SIZE_MAX,
                          priv ? s.nt_learn_from : SIZE_MAX};
            } else {
                out.nt.why = std::string(s.nt_kernel) + " not usable here (" + k.why_not + "): no non-temporal stores";
            }
        } else {
            out.nt.why = nt_why;
        }
    }
    if (s.sve_trap_min_from && cpu.sve_traps_after_syscall)
        p.notes.push_back("SVE used only from 256 KiB: Linux " + std::to_string(cpu.kernel_major) + "." +
                          std::to_string(cpu.kernel_minor) +
                          " (4.15 to 6.1) discards SVE state at every syscall, so a trap precedes the first SVE "
                          "instruction after one (evidence: arm-sve-syscall-trap)");
    for (const char* n : s.notes) p.notes.push_back(n);
    p.parallel = {s.parallel_from, 0, s.parallel_why, s.split_learn_from,
                  s.parallel_shared_from ? s.parallel_shared_from : s.parallel_from};
    finalize(p);
    return p;
}

}  // namespace

Profile builtin_profile(const CpuFacts& cpu) {
    const Spec* best = nullptr;
    int best_score = -1;
    for (const Spec& s : specs()) {
        int score = specificity(s, cpu);
        if (score > best_score) {
            best = &s;
            best_score = score;
        }
    }
    return resolve(*best, cpu, best_score);  // "portable" matches every CPU
}

Profile builtin_profile_named(const std::string& name, const CpuFacts& cpu) {
    std::string names;
    for (const Spec& s : specs()) {
        if (name == s.name) return resolve(s, cpu, specificity(s, cpu));
        names += (names.empty() ? "" : ", ") + std::string(s.name);
    }
    throw std::invalid_argument("no built-in profile named '" + name + "'; built-in profiles: " + names);
}

std::vector<BuiltinInfo> builtin_profiles(const CpuFacts& cpu) {
    std::vector<BuiltinInfo> out;
    for (const Spec& s : specs()) {
        int score = specificity(s, cpu);
        out.push_back({s.name, match_words(s), score >= 0, score});
    }
    return out;
}

std::vector<BuiltinTable> builtin_tables() {
    std::vector<BuiltinTable> out;
    for (const Spec& s : specs()) {
        BuiltinTable t;
        t.name = s.name;
        t.match = match_words(s);
        t.rank = rank(s);
        t.provenance = s.provenance;
        for (int r = 0; r < kRegions; ++r) {
            const RegionSpec& rs = s.regions[r];
            const ClassSpec* classes[kClasses] = {&rs.page_aligned, &rs.near, &rs.far, &rs.backward};
            for (int c = 0; c < kClasses; ++c)
                for (const BandSpec& b : *classes[c])
                    t.region[r].cls[c].push_back({b.from, b.kernel, b.fallback ? b.fallback : "", b.why});
            t.region[r].erms_on_request = rs.erms_on_request;
            t.region[r].erms_on_request_why = rs.erms_on_request_why ? rs.erms_on_request_why : "";
        }
        t.nt_kernel = s.nt_kernel ? s.nt_kernel : "";
        t.nt_min_page_distance = s.nt_min_page_distance;
        t.nt_min_page_distance_below = s.nt_min_page_distance_below;
        t.nt_learn_from = s.nt_learn_from;
        for (std::size_t l3 : {std::size_t(0), 32 * MiB, 512 * MiB}) {
            CpuFacts f;
            f.l3 = l3;
            f.cache_source = "sysfs";
            NtExample e;
            e.l3 = l3;
            nt_threshold_for(s, static_cast<int>(Region::Private), f, e.threshold, e.why);
            t.nt_examples.push_back(e);
            nt_threshold_for(s, static_cast<int>(Region::ToShared), f, e.threshold, e.why);
            t.shared_nt_examples.push_back(e);
        }
        t.parallel_from = s.parallel_from;
        t.parallel_why = s.parallel_why ? s.parallel_why : "";
        t.split_learn_from = s.split_learn_from;
        t.parallel_shared_from = std::max(s.parallel_from, s.parallel_shared_from);
        t.sve_trap_min_from = s.sve_trap_min_from;
        for (const char* n : s.notes) t.notes.push_back(n);
        out.push_back(std::move(t));
    }
    return out;
}

std::string builtin_match_rule() {
    return "a built-in profile matches a CPU when its architecture, vendors, family, model range and required "
           "features all match; of the profiles that match, the one of the highest rank wins (a model range adds " +
           std::to_string(kRankModel) + ", a family " + std::to_string(kRankFamily) + ", a vendor " +
           std::to_string(kRankVendor) + ", each required feature " + std::to_string(kRankFeature) +
           ", an architecture " + std::to_string(kRankArch) + "), the first listed on a tie";
}

}  // namespace policy
}  // namespace fastcopy
