// Helpers shared by the policy files: names, kernel facts, the derived fast-path fields.
#include "profile.h"

#include <cctype>
#include <mutex>
#include <set>
#include <stdexcept>

#include "../kernels/registry.h"
#include "select.h"

namespace fastcopy {
namespace policy {

const char* region_key(int region) {
    static const char* const keys[kRegions] = {"private", "to_shared", "from_shared"};
    return region >= 0 && region < kRegions ? keys[region] : "?";
}

const char* class_key(int cls) {
    static const char* const keys[kClasses] = {"page_aligned", "near", "far", "backward"};
    return cls >= 0 && cls < kClasses ? keys[cls] : "?";
}

const char* intern_kernel_name(const std::string& name) {
    static std::mutex lock;
    static std::set<std::string>* names = new std::set<std::string>();  // never freed: pointers stay valid
    std::lock_guard<std::mutex> g(lock);
    return names->insert(name).first->c_str();
}

bool kernel_in_build(const std::string& name) {
    for (const KernelEntry& e : kernel_registry())
        if (name == e.name) return true;
    return false;
}

KernelFacts kernel_facts(const std::string& name, const CpuFacts& cpu) {
    KernelFacts k;
    k.name = intern_kernel_name(name);
    unsigned have = cpu_features(cpu);
    for (const KernelEntry& e : kernel_registry()) {
        if (name != e.name) continue;
        k.compiled = true;
        k.fn = e.fn;
        k.streaming = e.streaming;
        unsigned missing = e.needs & ~have;
        k.usable = missing == 0;
        k.why_not = missing_feature_words(missing);
        return k;
    }
    k.why_not = "not a kernel of this build";
    return k;
}

std::string usable_kernel_names(const CpuFacts& cpu) {
    std::string s;
    unsigned have = cpu_features(cpu);
    for (const KernelEntry& e : kernel_registry())
        if ((e.needs & ~have) == 0) s += (s.empty() ? "" : ", ") + std::string(e.name);
    return s;
}

namespace {
// The sizes from 0 up where every class names the same kernel, cut at the NT threshold, at the
// first size where two classes differ, or where a (kUniformBands + 1)th kernel would start.
UniformBands uniform_bands(const RegionRules& rules) {
    UniformBands u;
    for (const auto& bands : rules.cls)
        if (bands.empty() || bands[0].from != 0) return u;
    int count = 0;
    std::size_t at = 0, below = rules.nt.threshold;
    while (at < below) {
        const Band& here = band_holding(rules.cls[0], at);
        bool same = true;
        for (const auto& bands : rules.cls) same = same && band_holding(bands, at).kernel == here.kernel;
        if (!same) {
            below = at;
            break;
        }
        if (count == 0 || u.kernel[count - 1] != here.kernel) {
            if (count == kUniformBands) {
                below = at;
                break;
            }
            u.from[count] = at;
            u.fn[count] = here.fn;
            u.kernel[count] = here.kernel;
            ++count;
        }
        std::size_t next = SIZE_MAX;  // the next size where some class's band changes
        for (const auto& bands : rules.cls)
            for (const auto& b : bands)
                if (b.from > at && b.from < next) next = b.from;
        at = next;
    }
    u.below = count ? below : 0;
    return u;
}
}  // namespace

void finalize(Profile& p) {
    for (int r = 0; r < kRegions; ++r) {
        RegionRules& rules = p.region[r];
        for (auto& bands : rules.cls) {
            // Adjacent bands with the same kernel are one band (the first one's reason stays).
            std::vector<Band> merged;
            for (auto& b : bands)
                if (merged.empty() || merged.back().kernel != b.kernel) merged.push_back(b);
            bands = merged;
        }
        if (rules.nt.threshold == SIZE_MAX || !rules.nt.fn) {
            rules.nt.threshold = SIZE_MAX;
        }
        p.uniform[r] = uniform_bands(rules);
    }
}

std::string size_words(std::size_t n) {
    if (n == SIZE_MAX) return "infinity";
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (u < 4 && n >= 1024 && n % 1024 == 0) {
        n /= 1024;
        ++u;
    }
    return std::to_string(n) + " " + units[u];
}

std::size_t parse_size(const std::string& text) {
    std::string t;
    for (char c : text) t += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
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

}  // namespace policy
}  // namespace fastcopy
