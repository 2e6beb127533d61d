// CPU detection: facts only, no policy. Detected once (cpu_facts()), in microseconds,
// without subprocesses. Unknown systems report arch "unknown" and all features false.
#pragma once
#include <cstddef>
#include <string>

namespace fastcopy {

struct CpuFacts {
    std::string arch = "unknown";     // "x86_64", "aarch64" or "unknown"
    std::string vendor = "unknown";   // x86: CPUID vendor string; ARM: implementer name or "unknown"
    unsigned family = 0, model = 0, stepping = 0;  // x86, extended fields folded in
    bool hypervisor = false;          // CPUID.1:ECX[31]

    // x86 features (AVX/AVX2/AVX-512 only true when the OS saves the register state: XGETBV)
    bool erms = false, fsrm = false, avx = false, avx2 = false;
    bool avx512f = false, avx512bw = false, avx512vl = false;

    // Cache sizes in bytes; 0 when unknown. l3 is the value the policy uses.
    std::size_t l1d = 0, l2 = 0, l3 = 0;
    std::size_t l3_cpuid = 0;         // what CPUID claims (under KVM maybe the host's: evidence: cpu-kvm-l3-cpuid)
    std::size_t l3_sysfs = 0;         // what /sys/devices/system/cpu/cpu0/cache says
    std::string cache_source = "none";  // "sysfs", "cpuid" or "none"

    // aarch64 features from getauxval(AT_HWCAP/AT_HWCAP2)
    bool asimd = false, sve = false, sve2 = false, mops = false;
    std::size_t sve_vector_bytes = 0;   // current SVE vector length in bytes (0 without SVE)
    unsigned midr_implementer = 0, midr_part = 0;  // from MIDR_EL1 via sysfs; 0 when unreadable
    bool midr_known = false;

    // Operating system
    int kernel_major = 0, kernel_minor = 0;
    // Linux 4.15 .. 6.1 discards SVE register state at every syscall, so the first SVE
    // instruction after one traps to the kernel (glibc avoids its SVE routines there).
    bool sve_traps_after_syscall = false;
    unsigned usable_cpus = 1;         // CPUs this process may run on (affinity mask)
};

// Detects the CPU of the calling process (cheap; no caching).
CpuFacts detect_cpu();
// The facts detected once, at first use (import time of the module).
const CpuFacts& cpu_facts();

}  // namespace fastcopy
