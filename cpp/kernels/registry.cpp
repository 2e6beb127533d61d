#include "registry.h"

namespace fastcopy {

const std::vector<KernelEntry>& kernel_registry() {
    static const std::vector<KernelEntry> registry = {
        {"generic", "the C library's memmove (glibc picks its own routine per CPU)", copy_generic, kNeedsNothing,
         false, nullptr},
#if defined(FASTCOPY_X86)
        {"avx2", "AVX2 32-byte loads and stores; overlapping head/tail, aligned-store main loop", copy_avx2,
         kNeedsAvx2, false, "avx2_nt"},
        {"avx2_nt", "AVX2 with non-temporal (streaming) stores and sfence, for copies larger than the caches",
         copy_avx2_nt, kNeedsAvx2, true, "avx2"},
        {"avx512", "AVX-512 64-byte loads and stores; overlapping head/tail, aligned-store main loop", copy_avx512,
         kNeedsAvx2 | kNeedsAvx512, false, "avx512_nt"},
        {"avx512_nt", "AVX-512 with non-temporal 64-byte stores and sfence, for copies larger than the caches",
         copy_avx512_nt, kNeedsAvx2 | kNeedsAvx512, true, "avx512"},
        {"erms", "rep movsb (Enhanced REP MOVSB); forward copies, memmove for backward overlap", copy_erms,
         kNeedsNothing, false, nullptr},
#endif
#if defined(FASTCOPY_ARM64)
        {"neon", "ASIMD (NEON) 16-byte loads and stores, 64 bytes per iteration", copy_neon, kNeedsNothing, false,
         nullptr},
        {"sve", "SVE vector-length-agnostic loop with a predicated tail", copy_sve, kNeedsSve, false, nullptr},
#endif
    };
    return registry;
}

const KernelEntry* find_registry_entry(const std::string& name) {
    for (const KernelEntry& e : kernel_registry())
        if (name == e.name) return &e;
    return nullptr;
}

unsigned cpu_features(const CpuFacts& f) {
    unsigned bits = 0;
    if (f.avx2) bits |= kNeedsAvx2;
    if (f.avx512f && f.avx512bw && f.avx512vl) bits |= kNeedsAvx512;
    if (f.sve) bits |= kNeedsSve;
    return bits;
}

std::string missing_feature_words(unsigned missing) {
    if (missing & kNeedsAvx2) return "this CPU lacks AVX2, or the OS does not save YMM state (XCR0 bits 1-2)";
    if (missing & kNeedsAvx512)
        return "this CPU lacks AVX-512 (F, BW and VL), or the OS does not save opmask and ZMM state (XCR0 bits 5-7)";
    if (missing & kNeedsSve) return "CPU or kernel lacks SVE (HWCAP_SVE is 0)";
    return "";
}

}  // namespace fastcopy
