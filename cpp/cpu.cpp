// CPU detection. Facts only; the policy that uses them is in dispatch.cpp.
#include "cpu.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#if defined(__linux__)
#include <sched.h>
#include <sys/auxv.h>
#include <sys/prctl.h>
#include <sys/utsname.h>
#endif

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#endif

namespace fastcopy {
namespace {

#if defined(__linux__)
// Reads a sysfs cache size like "32768K" or "32M"; 0 when absent.
std::size_t read_sysfs_size(const std::string& path) {
    std::ifstream f(path);
    std::string text;
    if (!(f >> text) || text.empty()) return 0;
    char* end = nullptr;
    unsigned long long v = std::strtoull(text.c_str(), &end, 10);
    if (end && (*end == 'K' || *end == 'k')) v <<= 10;
    else if (end && (*end == 'M' || *end == 'm')) v <<= 20;
    else if (end && (*end == 'G' || *end == 'g')) v <<= 30;
    return static_cast<std::size_t>(v);
}

std::string read_word(const std::string& path) {
    std::ifstream f(path);
    std::string text;
    f >> text;
    return text;
}

// Fills l1d/l2/l3 from /sys/devices/system/cpu/cpu0/cache/index*/ (level, type, size).
bool read_sysfs_caches(std::size_t& l1d, std::size_t& l2, std::size_t& l3) {
    bool any = false;
    for (int i = 0; i < 8; ++i) {
        std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
        std::string level = read_word(dir + "level");
        if (level.empty()) continue;
        std::string type = read_word(dir + "type");
        std::size_t size = read_sysfs_size(dir + "size");
        if (size == 0) continue;
        any = true;
        if (level == "1" && type == "Data") l1d = size;
        else if (level == "2" && type != "Instruction") l2 = size;
        else if (level == "3" && type != "Instruction") l3 = size;
    }
    return any;
}

void detect_os(CpuFacts& f) {
    struct utsname u;
    if (uname(&u) == 0) std::sscanf(u.release, "%d.%d", &f.kernel_major, &f.kernel_minor);
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        int count = CPU_COUNT(&set);
        f.usable_cpus = count > 0 ? static_cast<unsigned>(count) : 1u;
    }
}
#endif

#if defined(__x86_64__) || defined(_M_X64)
struct Regs { unsigned a = 0, b = 0, c = 0, d = 0; };

Regs cpuid(unsigned leaf, unsigned sub = 0) {
    Regs r;
    __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
    return r;
}

unsigned long long xgetbv0() {
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (static_cast<unsigned long long>(hi) << 32) | lo;
}

// L3 size as CPUID reports it: AMD leaf 0x8000001D / Intel leaf 4 (deterministic cache
// parameters), else AMD's legacy leaf 0x80000006. Under a hypervisor this may be the host's
// L3, not the guest's share (evidence: cpu-kvm-l3-cpuid).
void cpuid_caches(CpuFacts& f, unsigned max_ext, std::size_t& l1d, std::size_t& l2, std::size_t& l3) {
    bool amd = f.vendor == "AuthenticAMD" || f.vendor == "HygonGenuine";
    unsigned leaf = 0;
    if (amd && max_ext >= 0x8000001D) leaf = 0x8000001D;
    else if (!amd && cpuid(0).a >= 4) leaf = 4;
    if (leaf) {
        for (unsigned i = 0; i < 16; ++i) {
            Regs r = cpuid(leaf, i);
            unsigned type = r.a & 0x1f;  // 0 none, 1 data, 2 instruction, 3 unified
            if (type == 0) break;
            unsigned level = (r.a >> 5) & 7;
            std::size_t ways = ((r.b >> 22) & 0x3ff) + 1, parts = ((r.b >> 12) & 0x3ff) + 1;
            std::size_t line = (r.b & 0xfff) + 1, sets = static_cast<std::size_t>(r.c) + 1;
            std::size_t size = ways * parts * line * sets;
            if (level == 1 && type == 1) l1d = size;
            else if (level == 2 && type != 2) l2 = size;
            else if (level == 3 && type != 2) l3 = size;
        }
    }
    if (amd && l3 == 0 && max_ext >= 0x80000006) {
        Regs r = cpuid(0x80000006);
        l2 = static_cast<std::size_t>(r.c >> 16) << 10;
        l3 = static_cast<std::size_t>(r.d >> 18) << 19;  // in 512 KiB units
    }
}

void detect_x86(CpuFacts& f) {
    f.arch = "x86_64";
    Regs r0 = cpuid(0);
    char vendor[13] = {0};
    std::memcpy(vendor + 0, &r0.b, 4);
    std::memcpy(vendor + 4, &r0.d, 4);
    std::memcpy(vendor + 8, &r0.c, 4);
    f.vendor = vendor;
    unsigned max_leaf = r0.a;
    Regs r1 = cpuid(1);
    unsigned base_family = (r1.a >> 8) & 0xf, base_model = (r1.a >> 4) & 0xf;
    f.stepping = r1.a & 0xf;
    f.family = base_family == 0xf ? base_family + ((r1.a >> 20) & 0xff) : base_family;
    f.model = (base_family == 0x6 || base_family == 0xf) ? (((r1.a >> 16) & 0xf) << 4) + base_model
                                                         : base_model;
    f.hypervisor = (r1.c >> 31) & 1;
    bool osxsave = (r1.c >> 27) & 1, avx_cpu = (r1.c >> 28) & 1;
    unsigned long long xcr0 = osxsave ? xgetbv0() : 0;
    // XCR0: which register state the OS saves on a context switch. Using a register file the
    // OS does not save corrupts it (or faults), whatever CPUID says.
    bool ymm_state = (xcr0 & 0x6) == 0x6;              // bits 1, 2: SSE and AVX (upper YMM) state
    bool zmm_state = (xcr0 & 0xe6) == 0xe6;            // plus 5 opmask, 6 ZMM0-15 upper, 7 ZMM16-31
    f.avx = avx_cpu && ymm_state;
    if (max_leaf >= 7) {
        Regs r7 = cpuid(7, 0);
        f.avx2 = f.avx && ((r7.b >> 5) & 1);
        f.erms = (r7.b >> 9) & 1;
        f.fsrm = (r7.d >> 4) & 1;
        f.avx512f = zmm_state && ((r7.b >> 16) & 1);
        f.avx512bw = zmm_state && ((r7.b >> 30) & 1);
        f.avx512vl = zmm_state && ((r7.b >> 31) & 1);
    }
    unsigned max_ext = cpuid(0x80000000).a;
    cpuid_caches(f, max_ext, f.l1d, f.l2, f.l3_cpuid);
}
#endif

#if defined(__aarch64__) && defined(__linux__)
void detect_arm(CpuFacts& f) {
    f.arch = "aarch64";
    unsigned long hwcap = getauxval(AT_HWCAP), hwcap2 = getauxval(AT_HWCAP2);
    f.asimd = hwcap & (1UL << 1);    // HWCAP_ASIMD
    f.sve = hwcap & (1UL << 22);     // HWCAP_SVE
    f.sve2 = hwcap2 & (1UL << 1);    // HWCAP2_SVE2
    f.mops = hwcap2 & (1UL << 43);   // HWCAP2_MOPS (Linux 6.5+)
    if (f.sve) {
        int vl = prctl(51 /* PR_SVE_GET_VL */);
        if (vl > 0) f.sve_vector_bytes = static_cast<std::size_t>(vl & 0xffff);
    }
    std::string midr = read_word("/sys/devices/system/cpu/cpu0/regs/identification/midr_el1");
    if (!midr.empty()) {
        unsigned long long v = std::strtoull(midr.c_str(), nullptr, 16);
        f.midr_implementer = static_cast<unsigned>((v >> 24) & 0xff);
        f.midr_part = static_cast<unsigned>((v >> 4) & 0xfff);
        f.midr_known = true;
        switch (f.midr_implementer) {
            case 0x41: f.vendor = "ARM"; break;
            case 0x46: f.vendor = "Fujitsu"; break;
            case 0x48: f.vendor = "HiSilicon"; break;
            case 0x4e: f.vendor = "NVIDIA"; break;
            case 0x51: f.vendor = "Qualcomm"; break;
            case 0x61: f.vendor = "Apple"; break;
            case 0xc0: f.vendor = "Ampere"; break;
            default: f.vendor = "implementer 0x" + [&] { char b[8]; std::snprintf(b, sizeof b, "%02x", f.midr_implementer); return std::string(b); }();
        }
    }
}
#endif

}  // namespace

CpuFacts detect_cpu() {
    CpuFacts f;
#if defined(__linux__)
    detect_os(f);
#endif
#if defined(__x86_64__) || defined(_M_X64)
    detect_x86(f);
#elif defined(__aarch64__) && defined(__linux__)
    detect_arm(f);
    // Linux 4.15 (first with SVE) through 6.1 drops the SVE state on every syscall.
    f.sve_traps_after_syscall = f.sve && (f.kernel_major == 5 || (f.kernel_major == 4 && f.kernel_minor >= 15) ||
                                          (f.kernel_major == 6 && f.kernel_minor <= 1));
#endif
#if defined(__linux__)
    std::size_t l1d = 0, l2 = 0, l3 = 0;
    if (read_sysfs_caches(l1d, l2, l3)) {
        f.cache_source = "sysfs";
        f.l3_sysfs = l3;
        if (l1d) f.l1d = l1d;
        if (l2) f.l2 = l2;
        f.l3 = l3;
    }
#endif
    if (f.cache_source != "sysfs" && f.l3_cpuid) {
        f.cache_source = "cpuid";
        f.l3 = f.l3_cpuid;
    }
    return f;
}

const CpuFacts& cpu_facts() {
    static const CpuFacts facts = detect_cpu();
    return facts;
}

}  // namespace fastcopy
