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

unsigned cpu_features(const CpuFacts& f) {
    unsigned bits = 0;
    if (f.avx2) bits |= kNeedsAvx2;
    if (f.avx512f && f.avx512bw && f.avx512vl) bits |= kNeedsAvx512;
    if (f.sve) bits |= kNeedsSve;
    return bits;
}

std::string missing_feature_words(unsigned missing) {
    if (missing & kNeedsAvx2) return "CPU or OS lacks AVX2";
    if (missing & kNeedsAvx512) return "CPU or OS lacks AVX-512 (F, BW and VL with opmask and ZMM state enabled)";
    if (missing & kNeedsSve) return "CPU or kernel lacks SVE (HWCAP_SVE is 0)";
    return "";
}

}  // namespace fastcopy
