// Policy rules for CPUs we do not have, from synthetic facts: the AMD rep movsb opt-out,
// the shared-region rules, the non-temporal threshold from the real L3, the SVE rules.
#include <cstdio>
#include <string>
#include <vector>

#include "dispatch.h"

using namespace fastcopy;

static int failures = 0, checks = 0;
#define CHECK(cond, ...)                                              \
    do {                                                              \
        ++checks;                                                     \
        if (!(cond)) {                                                \
            ++failures;                                               \
            std::printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            std::printf(__VA_ARGS__);                                 \
            std::printf("\n");                                        \
        }                                                             \
    } while (0)

static std::string kernel_at(const std::vector<PolicyRule>& rules, const char* region, std::size_t n) {
    for (const auto& r : rules)
        if (r.region == region && n >= r.min_bytes && n < r.max_bytes) return r.kernel;
    return "none";
}

static bool any_kernel(const std::vector<PolicyRule>& rules, const char* region, const char* kernel) {
    for (const auto& r : rules)
        if (r.region == region && r.kernel == kernel) return true;
    return false;
}

static void check_tiling(const std::vector<PolicyRule>& rules, const char* what) {
    for (const char* region : {"private", "to_shared", "from_shared"}) {
        std::size_t next = 0;
        for (const auto& r : rules) {
            if (r.region != region) continue;
            CHECK(r.min_bytes == next, "%s %s: gap or overlap at %zu", what, region, r.min_bytes);
            CHECK(!r.reason.empty(), "%s %s: empty reason", what, region);
            next = r.max_bytes;
        }
        CHECK(next == SIZE_MAX, "%s %s: bands do not reach infinity", what, region);
    }
}

#if defined(FASTCOPY_X86)
static CpuFacts zen3_vm() {
    CpuFacts f;
    f.arch = "x86_64";
    f.vendor = "AuthenticAMD";
    f.family = 25;
    f.model = 1;
    f.hypervisor = true;
    f.erms = f.fsrm = f.avx = f.avx2 = true;
    f.l1d = 32 << 10;
    f.l2 = 512 << 10;
    f.l3_sysfs = f.l3 = std::size_t(32) << 20;
    f.l3_cpuid = std::size_t(256) << 20;  // what CPUID claims under KVM
    f.cache_source = "sysfs";
    return f;
}

static CpuFacts intel_vm() {
    CpuFacts f = zen3_vm();
    f.vendor = "GenuineIntel";
    f.family = 6;
    f.model = 143;
    f.l3_sysfs = f.l3 = f.l3_cpuid = std::size_t(480) << 20;
    return f;
}

static void test_x86() {
    Overrides automatic;
    auto amd = policy_for(zen3_vm(), automatic);
    check_tiling(amd, "zen3");
    for (const char* region : {"private", "to_shared", "from_shared"}) {
        CHECK(!any_kernel(amd, region, "erms"), "AMD opt-out: no rep movsb in %s", region);
        CHECK(kernel_at(amd, region, 64) == "generic", "small copies use the C library");
        CHECK(kernel_at(amd, region, 4096) == "avx2", "AMD mid band: avx2, got %s", kernel_at(amd, region, 4096).c_str());
        CHECK(kernel_at(amd, region, 512 << 10) == "avx2", "AMD 512 KiB: avx2");
    }
    // NT threshold from the sysfs L3 (32 MiB -> 16 MiB), not CPUID's false 256 MiB.
    CHECK(kernel_at(amd, "private", (16 << 20) - 1) == "avx2", "below 16 MiB: avx2");
    CHECK(kernel_at(amd, "private", 16 << 20) == "avx2_nt", "from 16 MiB: avx2_nt, got %s",
          kernel_at(amd, "private", 16 << 20).c_str());

    Overrides on;
    on.rep_movsb = "on";
    auto amd_on = policy_for(zen3_vm(), on);
    check_tiling(amd_on, "zen3 rep_movsb=on");
    CHECK(kernel_at(amd_on, "private", 65536) == "erms", "FASTCOPY_REP_MOVSB=on forces rep movsb in private copies");
    CHECK(!any_kernel(amd_on, "to_shared", "erms") && !any_kernel(amd_on, "from_shared", "erms"),
          "AMD: rep movsb stays off for shared regions even when forced on");

    auto intel = policy_for(intel_vm(), automatic);
    check_tiling(intel, "intel");
    CHECK(kernel_at(intel, "private", 65536) == "erms", "Intel with ERMS: rep movsb in the mid band");
    CHECK(kernel_at(intel, "to_shared", 65536) == "erms", "Intel: rep movsb into shared memory too");
    CHECK(kernel_at(intel, "private", 1024) == "generic", "Intel small: C library");
    CHECK(kernel_at(intel, "private", std::size_t(64) << 20) == "avx2_nt", "480 MiB L3 capped: NT from 64 MiB");
    CHECK(kernel_at(intel, "private", (std::size_t(64) << 20) - 1) == "erms", "below the cap: rep movsb");

    Overrides off;
    off.rep_movsb = "off";
    CHECK(!any_kernel(policy_for(intel_vm(), off), "private", "erms"), "FASTCOPY_REP_MOVSB=off");

    Overrides nt;
    nt.nt_threshold_set = true;
    nt.nt_threshold = 64 << 10;
    auto amd_nt = policy_for(zen3_vm(), nt);
    check_tiling(amd_nt, "zen3 nt=64K");
    CHECK(kernel_at(amd_nt, "private", 65536) == "avx2_nt", "FASTCOPY_NT_THRESHOLD=64K");
    CHECK(kernel_at(amd_nt, "private", 65535) == "avx2", "below FASTCOPY_NT_THRESHOLD");

    CpuFacts old = zen3_vm();  // no AVX2 (e.g. qemu -cpu max,-avx2,-erms): the C library everywhere
    old.avx = old.avx2 = old.erms = old.fsrm = false;
    auto plain = policy_for(old, automatic);
    check_tiling(plain, "no avx2");
    CHECK(kernel_at(plain, "private", 1 << 20) == "generic", "without AVX2 the C library");
    CHECK(!any_kernel(plain, "private", "avx2_nt"), "no NT without AVX2");

    CpuFacts unknown_l3 = zen3_vm();
    unknown_l3.l3 = unknown_l3.l3_sysfs = unknown_l3.l3_cpuid = 0;
    unknown_l3.cache_source = "none";
    CHECK(kernel_at(policy_for(unknown_l3, automatic), "private", 16 << 20) == "avx2_nt", "unknown L3: 16 MiB default");
}
#endif

#if defined(FASTCOPY_ARM64)
static void test_arm() {
    Overrides automatic;
    CpuFacts neon;
    neon.arch = "aarch64";
    neon.asimd = true;
    neon.kernel_major = 6;
    neon.kernel_minor = 8;
    auto p = policy_for(neon, automatic);
    check_tiling(p, "neon");
    CHECK(!any_kernel(p, "private", "sve"), "no SVE without HWCAP_SVE");

    CpuFacts a64fx = neon;
    a64fx.vendor = "Fujitsu";
    a64fx.sve = true;
    a64fx.sve_vector_bytes = 64;
    auto q = policy_for(a64fx, automatic);
    check_tiling(q, "a64fx");
    CHECK(kernel_at(q, "private", 4096) == "sve", "SVE from 2 KiB on a new kernel");

    a64fx.kernel_major = 5;
    a64fx.kernel_minor = 10;
    a64fx.sve_traps_after_syscall = true;
    auto r = policy_for(a64fx, automatic);
    check_tiling(r, "a64fx linux 5.10");
    CHECK(kernel_at(r, "private", 4096) == "generic", "Linux 5.10: no SVE for small copies (trap after syscall)");
    CHECK(kernel_at(r, "private", 256 << 10) == "sve", "Linux 5.10: SVE from 256 KiB");
}
#endif

int main() {
#if defined(FASTCOPY_X86)
    test_x86();
#endif
#if defined(FASTCOPY_ARM64)
    test_arm();
#endif
    std::printf("policy_tests: %d passed, %d failed\n", checks - failures, failures);
    return failures ? 1 : 0;
}
