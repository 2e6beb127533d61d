// The kernel registry: the only list of copy kernels. Tests, benchmarks, info() and the
// policy read it; adding a kernel is one file in cpp/kernels/ and one entry in registry.cpp.
#pragma once
#include <string>
#include <vector>

#include "../cpu.h"
#include "kernels.h"

namespace fastcopy {

// CPU features a kernel needs (a bit set). A kernel is usable when every bit it names is
// present in cpu_features(facts).
enum KernelFeature : unsigned {
    kNeedsNothing = 0,
    kNeedsAvx2 = 1u << 0,
    kNeedsAvx512 = 1u << 1,  // AVX-512 F + BW + VL with OS support for opmask and ZMM state
    kNeedsSve = 1u << 2,
};

struct KernelEntry {
    const char* name;          // "generic", "avx2", "avx2_nt", "erms", "neon", "sve", ...
    const char* description;   // one sentence for users
    CopyFn fn;
    unsigned needs;            // KernelFeature bits
    bool streaming;            // non-temporal stores: for copies larger than the caches
    const char* twin;          // streaming kernel: its cache-friendly twin (same vectors); else its
                               // streaming twin; nullptr when there is none
};

// Every kernel compiled into this build, in priority order (the order kernels() lists them).
const std::vector<KernelEntry>& kernel_registry();
// The registry entry named `name`; nullptr when no such kernel is compiled in.
const KernelEntry* find_registry_entry(const std::string& name);
// The KernelFeature bits these CPU facts provide.
unsigned cpu_features(const CpuFacts& facts);
// Plain words for the first feature in `missing` (for "why not" in info()).
std::string missing_feature_words(unsigned missing);

}  // namespace fastcopy
