// FASTCOPY_* environment variables: read them (clear errors naming the variable) and edit a
// profile with them, so the overrides apply on top of any profile, built-in or tuned.
#include <cctype>
#include <cstdlib>
#include <stdexcept>

#include "profile.h"

namespace fastcopy {
namespace policy {
namespace {

std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

const OverrideVariable& variable(const std::string& name) {
    for (const OverrideVariable& v : override_variables())
        if (v.name == name) return v;
    throw std::logic_error("no override variable " + name);
}

// One rule for every FASTCOPY_* variable (override_reading_rule()): surrounding whitespace
// (spaces, tabs, newlines, as a shell script or a .env file may leave) is removed, and a
// variable that is then empty counts as not set. Returns false for an unset or blank variable.
bool env(const char* name, std::string& out) {
    const char* v = std::getenv(name);
    if (!v) return false;
    std::string s(v);
    const char* space = " \t\n\r\f\v";
    std::size_t lo = s.find_first_not_of(space);
    if (lo == std::string::npos) return false;
    out = s.substr(lo, s.find_last_not_of(space) - lo + 1);
    return true;
}

}  // namespace

const char* override_reading_rule() {
    return "surrounding whitespace (spaces, tabs, newlines) is removed from the value, and a variable that is then "
           "empty counts as not set";
}

const std::vector<OverrideVariable>& override_variables() {
    static const std::vector<OverrideVariable> all = {
        {"FASTCOPY_KERNEL", "the name of a kernel of this build that this CPU supports (fastcopy.kernels())",
         "every copy, of every size and region, uses that kernel, without the thread pool", "automatic", 0, -1},
        {"FASTCOPY_REP_MOVSB", "auto, on or off",
         "on: rep movsb in the far class ((dst - src) mod 4096 >= 64) from the region's rep_movsb_on size up to "
         "the NT threshold, in every region whose profile allows it, never in the near or backward class; off: "
         "every rep movsb band uses the C library; auto: the profile as it is",
         "auto", 0, -1},
        {"FASTCOPY_NT_THRESHOLD", "bytes or a binary unit such as 64K, 8M, 1G, or off",
         "the size from which non-temporal stores are used, in every region whose profile has an NT kernel (the "
         "profile's page-distance guard stays); off: no non-temporal stores",
         "the profile's threshold", 0, -1},
        {"FASTCOPY_NT_LEARN_FROM", "bytes or a binary unit such as 1M, 4M (at least 256K), or off",
         "private copies without overlap from this size time themselves and use cached or streaming stores, "
         "whichever ran faster lately, those the NT rule streams as well (each size class starts as the rule says; "
         "nt.learn_from); off: the profile as it is. No effect without an NT rule",
         "the profile's nt.learn_from", 0, -1},
        {"FASTCOPY_SPLIT_LEARN_FROM", "bytes or a binary unit such as 256K, 1M (at least 256K), or off",
         "private copies on the thread pool from this size (below nt.learn_from) time themselves and run split or "
         "on the calling thread alone, whichever ran faster lately (parallel.learn_from); off: they always split",
         "the profile's parallel.learn_from", 0, -1},
        {"FASTCOPY_THREADS",
         "a whole number from 1 (no threading) to " + std::to_string(kMaxThreads) + ", or 0 for the default",
         "the threads a large copy uses, the calling thread included; 1 disables threading; 0 is the default, as "
         "for fastcopy.set_threads(0), which also overrides it at run time",
         "0", 0, static_cast<long long>(kMaxThreads)},
    };
    return all;
}

namespace {
// The value of a size variable: SIZE_MAX for "off", else a size of at least `min`. Throws
// std::invalid_argument naming the variable, the value and the valid values.
std::size_t size_or_off(const char* name, const std::string& value, std::size_t min) {
    if (lower(value) == "off") return SIZE_MAX;
    std::size_t n = 0;
    try {
        n = parse_size(value);
    } catch (const std::invalid_argument&) {
        throw std::invalid_argument(std::string(name) + "='" + value + "' is not a size; use " + variable(name).values);
    }
    if (n < min)
        throw std::invalid_argument(std::string(name) + "='" + value + "' is below the least it can be; use " +
                                    variable(name).values);
    return n;
}
}  // namespace

Overrides read_overrides(const CpuFacts& cpu) {
    Overrides o;
    std::string value;
    const char* v = nullptr;
    if (env("FASTCOPY_KERNEL", value)) {
        o.kernel = value;
        KernelFacts k = kernel_facts(o.kernel, cpu);
        if (!k.compiled)
            throw std::invalid_argument("FASTCOPY_KERNEL='" + o.kernel +
                                        "' is not a kernel of this build; valid names here: " + usable_kernel_names(cpu));
        if (!k.usable)
            throw std::invalid_argument("FASTCOPY_KERNEL='" + o.kernel + "' is not supported on this CPU (" +
                                        k.why_not + "); valid names here: " + usable_kernel_names(cpu));
    }
    if (env("FASTCOPY_REP_MOVSB", value)) {
        v = value.c_str();
        o.rep_movsb = lower(v);
        if (o.rep_movsb != "auto" && o.rep_movsb != "on" && o.rep_movsb != "off")
            throw std::invalid_argument(std::string("FASTCOPY_REP_MOVSB='") + v + "' is not valid; use " +
                                        variable("FASTCOPY_REP_MOVSB").values);
    }
    if (env("FASTCOPY_NT_THRESHOLD", value)) {
        o.nt_threshold_set = true;
        o.nt_threshold = size_or_off("FASTCOPY_NT_THRESHOLD", value, 0);
    }
    if (env("FASTCOPY_NT_LEARN_FROM", value)) {
        o.nt_learn_from_set = true;
        o.nt_learn_from = size_or_off("FASTCOPY_NT_LEARN_FROM", value, kMinNtLearnFrom);
    }
    if (env("FASTCOPY_SPLIT_LEARN_FROM", value)) {
        o.split_learn_from_set = true;
        o.split_learn_from = size_or_off("FASTCOPY_SPLIT_LEARN_FROM", value, kMinSplitLearnFrom);
    }
    if (env("FASTCOPY_THREADS", value)) {
        v = value.c_str();
        // 0 means the default, as set_threads(0) does.
        char* end = nullptr;
        long n = std::strtol(v, &end, 10);
        const OverrideVariable& threads = variable("FASTCOPY_THREADS");
        if (end == v || *end != '\0' || n < threads.min || n > threads.max)
            throw std::invalid_argument(std::string("FASTCOPY_THREADS='") + v + "' is not valid; use " + threads.values);
        o.threads = static_cast<int>(n);
    }
    return o;
}

void apply_overrides(Profile& p, const Overrides& o, const CpuFacts& cpu) {
    if (!o.kernel.empty()) {
        KernelFacts k = kernel_facts(o.kernel, cpu);
        if (k.usable) {  // read_overrides checked it; never force an unusable kernel
            p.forced = k.fn;
            p.forced_kernel = k.name;
            p.overrides.push_back("FASTCOPY_KERNEL=" + o.kernel + ": every copy uses " + o.kernel +
                                  " (no thread pool)");
        }
    }
    // The NT threshold first: FASTCOPY_REP_MOVSB=on puts rep movsb up to it.
    if (o.nt_threshold_set) {
        for (auto& region : p.region) {
            if (o.nt_threshold == SIZE_MAX) {
                region.nt.threshold = SIZE_MAX;
                region.nt.why = "FASTCOPY_NT_THRESHOLD=off";
            } else if (region.nt.fn) {
                region.nt.threshold = o.nt_threshold;
                region.nt.why = "set by FASTCOPY_NT_THRESHOLD (the profile said: " + region.nt.why + ")";
            }
        }
        p.overrides.push_back(o.nt_threshold == SIZE_MAX ? "FASTCOPY_NT_THRESHOLD=off: no non-temporal stores"
                                                         : "FASTCOPY_NT_THRESHOLD=" + size_words(o.nt_threshold));
    }
    NtRule& private_nt = p.region[static_cast<int>(Region::Private)].nt;
    if (o.nt_learn_from_set) {
        private_nt.learn_from = o.nt_learn_from;
        p.overrides.push_back(o.nt_learn_from == SIZE_MAX
                                  ? "FASTCOPY_NT_LEARN_FROM=off: no private copy learns its store mode"
                                  : "FASTCOPY_NT_LEARN_FROM=" + size_words(o.nt_learn_from) +
                                        ": private copies from there learn their store mode");
    }
    if (o.split_learn_from_set) {
        p.parallel.learn_from = o.split_learn_from;
        p.overrides.push_back(o.split_learn_from == SIZE_MAX
                                  ? "FASTCOPY_SPLIT_LEARN_FROM=off: private copies on the pool always split"
                                  : "FASTCOPY_SPLIT_LEARN_FROM=" + size_words(o.split_learn_from) +
                                        ": private copies on the pool from there learn to split or run alone");
    }
    // Learning chooses between cached stores and the NT kernel: nothing to learn without one.
    if (private_nt.threshold == SIZE_MAX || !private_nt.fn) private_nt.learn_from = SIZE_MAX;
    const char* erms = intern_kernel_name("erms");
    if (o.rep_movsb == "off") {
        KernelFacts generic = kernel_facts("generic", cpu);
        for (auto& region : p.region)
            for (auto& bands : region.cls)
                for (auto& b : bands)
                    if (b.kernel == erms) {
                        b.kernel = generic.name;
                        b.fn = generic.fn;
                        b.why = "the C library: rep movsb off by FASTCOPY_REP_MOVSB=off (the profile had erms here: " +
                                b.why + ")";
                    }
        p.overrides.push_back("FASTCOPY_REP_MOVSB=off: every rep movsb band uses the C library");
    } else if (o.rep_movsb == "on") {
        KernelFacts k = kernel_facts("erms", cpu);
        bool any = false;
        for (int r = 0; r < kRegions; ++r) {
            RegionRules& region = p.region[r];
            if (!k.usable || region.erms_on_request == SIZE_MAX) continue;
            // Only the far class: at (dst - src) mod 4096 in 1..63 rep movsb collapses on AMD
            // (evidence: zen3-rep-movsb-4k-aliasing), and rep movsb does not copy backward.
            std::vector<Band>& far = region.cls[static_cast<int>(AddressClass::Far)];
            std::size_t from = region.erms_on_request, to = region.nt.threshold;
            if (from >= to) continue;
            std::vector<Band> out;
            for (std::size_t i = 0; i < far.size(); ++i) {
                std::size_t lo = far[i].from, hi = i + 1 < far.size() ? far[i + 1].from : SIZE_MAX;
                if (hi <= from || lo >= to) {
                    out.push_back(far[i]);
                    continue;
                }
                if (lo < from) {
                    out.push_back(far[i]);
                }
                Band e{lo < from ? from : lo, k.fn, k.name,
                       region.erms_on_request_why.empty() ? "rep movsb: FASTCOPY_REP_MOVSB=on" : region.erms_on_request_why};
                out.push_back(e);
                if (hi > to) {
                    Band rest = far[i];
                    rest.from = to;
                    out.push_back(rest);
                }
            }
            far = out;
            any = true;
        }
        p.overrides.push_back(any ? "FASTCOPY_REP_MOVSB=on: rep movsb in the far class ((dst - src) mod 4096 >= 64) "
                                    "where the profile allows it"
                                  : "FASTCOPY_REP_MOVSB=on: no region of this profile allows rep movsb");
    }
    if (o.threads > 0)
        p.overrides.push_back("FASTCOPY_THREADS=" + std::to_string(o.threads) + ": threads for large copies");
    finalize(p);
}

}  // namespace policy
}  // namespace fastcopy
