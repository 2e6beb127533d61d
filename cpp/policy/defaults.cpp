// The built-in profiles: one table per CPU family with measurements behind it, each with its
// provenance, and the rule that matches it to a CPU. The most specific
// matching profile wins (model range, then family, then vendor, then required features).
// Thresholds that depend on the machine's caches (the non-temporal threshold) and on the
// Linux version (the SVE trap rule) are computed from the CPU facts when a profile is resolved,
// and their reasons say so.
#include <algorithm>
#include <stdexcept>

#include "profile.h"

namespace fastcopy {
namespace policy {
namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;

// What a built-in profile requires of the CPU (besides its architecture).
enum MatchNeeds : unsigned { kMatchAvx2 = 1, kMatchAvx512 = 2, kMatchSve = 4, kMatchErms = 8 };

struct BandSpec {
    std::size_t from;
    const char* kernel;
    const char* fallback;  // used when `kernel` is not in this build or not usable on this CPU
    const char* why;
};
using ClassSpec = std::vector<BandSpec>;

enum class NtKind { None, HalfL3Cap64M, HalfL3Cap12M, TwiceL3 };

struct RegionSpec {
    ClassSpec page_aligned, near, far, backward;
    std::size_t erms_on_request;  // SIZE_MAX: FASTCOPY_REP_MOVSB=on does not reach this region
    const char* erms_on_request_why;
};

struct Spec {
    const char* name;
    const char* arch;
    std::vector<const char*> vendors;  // empty: any
    int family;                        // -1: any
    int model_lo, model_hi;            // -1: any
    unsigned needs;                    // MatchNeeds
    Provenance provenance;
    RegionSpec regions[kRegions];
    NtKind nt;
    const char* nt_kernel;
    std::size_t nt_min_page_distance;  // NtRule::min_page_distance
    std::size_t parallel_from;
    const char* parallel_why;
    std::size_t sve_trap_min_from;     // SVE bands start no lower than this on Linux 4.15..6.1 (0: no rule)
    std::vector<const char*> notes;
};

// ---------------------------------------------------------------------------------------
// Reasons. Each says in plain words why the band or rule is what it is and cites the
// measurements behind it (docs/evidence/<subject>.md, printed by `info --verbose`).
const char* const kParallelWhy =
    "two threads gain from 1 MiB back to back and about break even there when the worker sleeps "
    "(evidence: intel-parallel-from-1mib, pool-parallel-threshold)";
const char* const kParallelZen5Why =
    "two threads double the best single-thread bandwidth at 1 MiB (evidence: zen5-parallel-from-1mib)";
const char* const kLibcSmall =
    "the C library: below 2 KiB the call costs more than the copy and glibc's overlapping vector moves are as fast as "
    "any loop here";

// ---- AMD Zen 3 (family 25 without AVX-512) ----------------------------------------------
const char* const kZen3Small =
    "the C library below 128 B: the call costs more than the copy and the AVX2 loop wins or loses by distance "
    "(evidence: zen3-avx2-from-128)";
const char* const kZen3Avx2 =
    "AVX2 loop: faster than glibc from 128 B to 2 KiB and page-aligned at 4-16 KiB, even with it above "
    "(evidence: zen3-avx2-from-128, zen3-avx2-far)";
const char* const kZen3Near =
    "AVX2 loop: rep movsb, and glibc which runs it from 2112 B, collapse 15-45x at these distances; the AVX2 loop "
    "does not (evidence: zen3-rep-movsb-4k-aliasing)";
const char* const kZen3Backward =
    "AVX2 loop (backward direction): glibc copies backward overlaps with a vector loop too, and rep movsb cannot run "
    "backward";
const char* const kAmdNoErmsShared =
    "rep movsb stays off in shared regions on AMD even with FASTCOPY_REP_MOVSB=on: it runs about 2x slower into and "
    "out of memory another process touches (evidence: amd-shared-no-rep-movsb)";
const char* const kZen3ErmsOn =
    "FASTCOPY_REP_MOVSB=on: rep movsb in the far class only, where it runs as fast as glibc (evidence: zen3-erms-far)";
const char* const kZen3NtDistance =
    "non-temporal stores only when (dst - src) mod 4096 is 0 or at least 512: at smaller distances they run several "
    "times slower than plain stores (evidence: zen3-nt-page-distance)";

// ---- AMD Zen 4 (family 25 with AVX-512) --------------------------------------------------
// Zen 3 never has AVX-512 and every Zen 4 has it, so the AVX-512 flag separates the two
// within family 25.
const char* const kZen4Small =
    "the C library below 192 B: the AVX2 loop loses or ties at 128-160 B (evidence: zen4-avx2-from-192)";
const char* const kZen4Avx2 =
    "AVX2 loop: ties or beats glibc from 192 B, even with it from 32 KiB; avx512 is not faster "
    "(evidence: zen4-avx2-from-192, kernels-avx512-zen4)";
const char* const kZen4Near =
    "AVX2 loop: rep movsb, and glibc which runs it, collapse up to 32x at these distances on Zen 4 as on Zen 3 "
    "(evidence: zen4-rep-movsb-4k-aliasing)";
const char* const kZen4Backward =
    "AVX2 loop (backward direction): glibc copies backward overlaps with a vector loop too, and rep movsb cannot run "
    "backward";
const char* const kZen4ErmsOn =
    "FASTCOPY_REP_MOVSB=on: rep movsb in the far class only, where it runs as fast as glibc (evidence: zen4-erms-far)";
const char* const kZen4NoAvx512 =
    "avx512 is usable here but not chosen: Zen 4 executes 512-bit loads and stores as two halves, and avx512 is at "
    "best even with avx2 and up to 3x slower at some distances; it does not lower the clock either "
    "(evidence: kernels-avx512-zen4, kernels-no-clock-drop)";
const char* const kZen4NtDistance =
    "non-temporal stores only when (dst - src) mod 4096 is 0 or at least 512: they lose at small distances on Zen 4 "
    "too, and one threshold serves every distance (evidence: zen4-nt-page-distance)";

const char* const kZen4LibcGap =
    "the C library at 448-575 B page-aligned and far: glibc beats the AVX2 loop there (evidence: zen4-libc-448-575)";

const char* const kZen4ParallelWhy =
    "two threads gain from 512 KiB back to back and lose under 10 % from 1 MiB when the worker sleeps "
    "(evidence: zen4-parallel-from-1mib)";

struct AmdTable {
    std::size_t vector_from;  // the AVX2 loop from this size, the C library below
    const char *small, *avx2, *near, *backward, *erms_on;
    // [libc_from, libc_to): the C library again in the page-aligned and far classes (0: none)
    std::size_t libc_from, libc_to;
    const char* libc_why;
    const char* parallel_why;  // the thread pool from 1 MiB, and why
};
const AmdTable kZen3Table = {128, kZen3Small, kZen3Avx2, kZen3Near, kZen3Backward, kZen3ErmsOn,
                             0,   0,          nullptr,   kParallelWhy};
const AmdTable kZen4Table = {192, kZen4Small, kZen4Avx2,    kZen4Near,       kZen4Backward, kZen4ErmsOn,
                             448, 576,        kZen4LibcGap, kZen4ParallelWhy};

RegionSpec amd_region(const AmdTable& t, bool shared) {
    ClassSpec cls = {{0, "generic", nullptr, t.small}, {t.vector_from, "avx2", "generic", t.avx2}};
    if (t.libc_from) {
        cls.push_back({t.libc_from, "generic", nullptr, t.libc_why});
        cls.push_back({t.libc_to, "avx2", "generic", t.avx2});
    }
    ClassSpec near = {{0, "generic", nullptr, t.small}, {t.vector_from, "avx2", "generic", t.near}};
    ClassSpec back = {{0, "generic", nullptr, t.small}, {t.vector_from, "avx2", "generic", t.backward}};
    return {cls, near, cls, back, shared ? SIZE_MAX : std::size_t(2112), shared ? kAmdNoErmsShared : t.erms_on};
}

Spec amd_spec(const char* name, int family, unsigned needs, const AmdTable& table, Provenance provenance,
              std::vector<const char*> notes) {
    Spec s{};
    s.name = name;
    s.arch = "x86_64";
    s.vendors = {"AuthenticAMD", "HygonGenuine"};
    s.family = family;
    s.model_lo = s.model_hi = -1;
    s.needs = needs;
    s.provenance = std::move(provenance);
    s.regions[0] = amd_region(table, false);
    s.regions[1] = amd_region(table, true);
    s.regions[2] = amd_region(table, true);
    s.nt = NtKind::HalfL3Cap64M;
    s.nt_kernel = "avx2_nt";
    s.nt_min_page_distance = 512;
    s.parallel_from = 1 * MiB;
    s.parallel_why = table.parallel_why;
    s.notes = std::move(notes);
    return s;
}

Provenance zen3_provenance(const char* machine_note) {
    return {std::string("AMD EPYC family 25 model 1 (Zen 3) under KVM, 2 vCPUs, 32 MiB L3") + machine_note,
            "2026-11-30", "glibc 2.36",
            "cpp/bench/kernel_bench: kernels interleaved, medians of 5-11 rounds, hot caches (evidence: "
            "zen3-avx2-from-128, zen3-nt-half-l3)"};
}

Spec zen3_spec() {
    return amd_spec("amd-zen3", 25, kMatchAvx2, kZen3Table, zen3_provenance(""), {kZen3NtDistance});
}

Spec other_amd_spec() {
    return amd_spec("amd-avx2", -1, kMatchAvx2, kZen3Table,
                    zen3_provenance("; used for other AMD families as the nearest measured"),
                    {"no measurement of this AMD family: the Zen 3 table (the nearest measured AMD CPU)",
                     kZen3NtDistance});
}

Spec zen4_spec() {
    return amd_spec("amd-zen4", 25, kMatchAvx2 | kMatchAvx512, kZen4Table,
                    {"AMD EPYC family 25 model 17 stepping 1 (Zen 4, Genoa) under KVM, 2 vCPUs, 32 MiB L3", "2026-12-01",
                     "glibc 2.36",
                     "cpp/bench/kernel_bench: kernels interleaved, medians of 9-31 rounds, hot caches (evidence: "
                     "zen4-avx2-from-192, zen4-nt-half-l3)"},
                    {kZen4NoAvx512, kZen4NtDistance});
}

// ---- AMD Zen 5 (family 26) --------------------------------------------------------------
// No 4K-aliasing collapse of rep movsb on Zen 5. The `avx512` band names a kernel that a
// build or a VM may lack: it falls back to glibc, which ties avx2 there. The near class takes
// avx2, not avx512: AVX-512 was measured at distances 0 and 16 only, and on Zen 4 it lost at
// distances 40-63 (evidence: zen5-near-avx2).
const char* const kZen5Avx512 =
    "AVX-512 loop: faster than an AVX2 loop and glibc at 1-16 KiB on Zen 5's full-width units "
    "(evidence: zen5-avx512-2k-24k)";
const char* const kZen5Erms =
    "rep movsb: ties glibc (which runs it) to 1 MiB, wins slightly above, beats the AVX2 loop; no 4K-aliasing "
    "collapse on Zen 5 (evidence: zen5-erms-from-24k)";
const char* const kZen5Near =
    "AVX2 loop from 3 KiB at (dst - src) mod 4096 in 1..63: faster than glibc to 16 KiB; avx512 was not measured at "
    "these distances (evidence: zen5-near-avx2)";
const char* const kZen5NearMid =
    "the C library at (dst - src) mod 4096 in 1..63 from 24 KiB: faster than the AVX2 loop there; rep movsb itself "
    "stays out of the near class (evidence: zen5-near-avx2)";
const char* const kZen5Back =
    "the C library for backward overlaps (no Zen 5 measurement of the vector loops there)";
const char* const kZen5ErmsOn =
    "FASTCOPY_REP_MOVSB=on: rep movsb in the far class from 2112 B (glibc's threshold)";

RegionSpec zen5_region() {
    ClassSpec wide = {{0, "generic", nullptr, kLibcSmall},
                      {2048, "avx512", "generic", kZen5Avx512},
                      {24 * KiB, "erms", "generic", kZen5Erms}};
    ClassSpec near = {{0, "generic", nullptr, kLibcSmall},
                      {3 * KiB, "avx2", "generic", kZen5Near},
                      {24 * KiB, "generic", nullptr, kZen5NearMid}};
    ClassSpec back = {{0, "generic", nullptr, kZen5Back}};
    return {wide, near, wide, back, 2112, kZen5ErmsOn};
}

Spec zen5_spec() {
    Spec s{};
    s.name = "amd-zen5";
    s.arch = "x86_64";
    s.vendors = {"AuthenticAMD"};
    s.family = 26;
    s.model_lo = s.model_hi = -1;
    s.needs = kMatchAvx2;
    s.provenance = {"AMD EPYC family 26 model 2 stepping 1 (Zen 5, Turin) under KVM, 2 vCPUs, 32 MiB L3", "2026-11",
                    "glibc 2.36",
                    "python -m fastcopy bench with every forced kernel and plain C loops: one thread, hot caches, "
                    "medians of 5-7 interleaved repeats (evidence: zen5-avx512-2k-24k, zen5-erms-from-24k)"};
    for (auto& r : s.regions) r = zen5_region();
    s.nt = NtKind::TwiceL3;
    s.nt_kernel = "avx2_nt";
    s.parallel_from = 1 * MiB;
    s.parallel_why = kParallelZen5Why;
    s.notes = {"Zen 5: copies into and out of a shared mapping behave like private ones, so all three regions share "
               "one table (evidence: zen5-shared-like-private)"};
    return s;
}

// ---- Intel with ERMS (glibc's public thresholds; Intel Xeon VM figures) -------------------
const char* const kIntelLibc =
    "the C library: on Intel glibc's EVEX/AVX-512 or AVX2 loops beat our AVX2 loop (188 vs 141 GB/s at 4 KiB on an "
    "Intel Xeon VM) and guard their own rep movsb";
const char* const kIntelErms =
    "rep movsb: Intel with ERMS, glibc's public thresholds (from 2112 B with FSRM, 4096 B without: 4096 covers both, "
    "glibc itself uses rep movsb from 2112 B with FSRM) up to the non-temporal threshold; (dst - src) mod 4096 >= 64 only";
const char* const kIntelErmsOn = "FASTCOPY_REP_MOVSB=on: rep movsb in the far class from 2112 B";

RegionSpec intel_region() {
    ClassSpec libc = {{0, "generic", nullptr, kIntelLibc}};
    ClassSpec far = {{0, "generic", nullptr, kIntelLibc}, {4096, "erms", "generic", kIntelErms}};
    return {libc, libc, far, libc, 2112, kIntelErmsOn};
}

// ---- Intel with AVX-512 and ERMS (Sapphire Rapids class), measured on the development machine
// Intel Xeon family 6 model 167 under KVM, 2 vCPUs, L1d 48 KiB, L2 2 MiB, glibc 2.36 (memcpy is
// glibc's AVX-512 unaligned-erms variant: rep movsb from 2112 B to 181 MiB). Every figure and
// the command behind it: docs/evidence/intel.md, cited by id.
const char* const kIntelAvx512Small =
    "the C library below 384 B: the call costs more than the copy; glibc's overlapping EVEX moves and avx512 within a "
    "few percent (evidence: intel-avx512-band)";
const char* const kIntelAvx512 =
    "AVX-512 loop: 1.03-1.07x glibc at 256 B-2 KiB (glibc's own vector loop there) and 1.09-1.21x glibc and rep movsb "
    "at 2-8 KiB, 1.01-1.05x at 8-16 KiB (glibc runs rep movsb from 2112 B); at (dst - src) mod 4096 in 1..63 "
    "1.08-1.13x up to 20 KiB (evidence: intel-avx512-band)";
const char* const kIntelAlignedMid =
    "the C library from 16 KiB page-aligned: avx512 ran 0.78x glibc (0.66-0.94) at 16-23 KiB, where source and "
    "destination outgrow the 48 KiB L1d together, and no kernel of ours beat glibc in the L2 range (evidence: "
    "intel-avx512-band, intel-l2-range)";
const char* const kIntelNearMid =
    "the C library from 21 KiB at (dst - src) mod 4096 in 1..63 (glibc runs its vector loop there, not rep movsb): "
    "avx512 ran 0.79-0.89x glibc at 22-23 KiB and no kernel of ours won in the L2 range in two runs (evidence: "
    "intel-avx512-band, intel-l2-range)";
const char* const kIntelAvx512Erms =
    "rep movsb from 19 KiB in the far class (glibc runs it too): avx512 ran 0.84-0.96x glibc at 19.7-23 KiB at "
    "distances from 256; in the L2 range rep movsb and glibc ran at the same speed and avx2 and avx512 at 0.91-0.99x "
    "(medians by size range, two runs) (evidence: intel-avx512-band, intel-l2-range)";

RegionSpec intel_avx512_region() {
    ClassSpec aligned = {{0, "generic", nullptr, kIntelAvx512Small},
                         {384, "avx512", "generic", kIntelAvx512},
                         {16 * KiB, "generic", nullptr, kIntelAlignedMid}};
    ClassSpec near = {{0, "generic", nullptr, kIntelAvx512Small},
                      {384, "avx512", "generic", kIntelAvx512},
                      {21 * KiB, "generic", nullptr, kIntelNearMid}};
    ClassSpec far = {{0, "generic", nullptr, kIntelAvx512Small},
                     {384, "avx512", "generic", kIntelAvx512},
                     {19 * KiB, "erms", "generic", kIntelAvx512Erms}};
    ClassSpec back = {{0, "generic", nullptr, kIntelLibc}};
    return {aligned, near, far, back, 2112, kIntelErmsOn};
}

Spec intel_spec(bool avx512) {
    Spec s{};
    s.name = avx512 ? "intel-erms-avx512" : "intel-erms";
    s.arch = "x86_64";
    s.vendors = {"GenuineIntel"};
    s.family = -1;
    s.model_lo = s.model_hi = -1;
    s.needs = kMatchErms | (avx512 ? kMatchAvx512 : 0u);
    if (avx512)
        s.provenance = {"Intel Xeon family 6 model 167 stepping 1 (Sapphire Rapids class) under KVM, 2 vCPUs, L1d 48 "
                        "KiB, L2 2 MiB, AVX-512 F/BW/VL, ERMS, FSRM; machine shared with other jobs",
                        "2026-12-03", "glibc 2.36",
                        "python -m fastcopy tune --check and benchmarks/policy_quality.py (every kernel forced through "
                        "Python, fresh allocations, random sizes and distances, interleaved medians); "
                        "cpp/bench/bandwidth --quick at 4-256 MiB; figures in docs/evidence/intel.md"};
    else
        s.provenance = {"Intel Xeon (family 6 model 143) under KVM, 2 vCPUs (the development machine before Zen 3); "
                        "glibc's public rep movsb thresholds for CPUs not measured",
                        "2026-11", "glibc 2.36",
                        "python -m fastcopy bench and cpp/bench/bandwidth, medians of 3-9 interleaved repeats, hot "
                        "caches"};
    for (auto& r : s.regions) r = avx512 ? intel_avx512_region() : intel_region();
    s.nt = avx512 ? NtKind::HalfL3Cap12M : NtKind::HalfL3Cap64M;
    s.nt_kernel = avx512 ? "avx512_nt" : "avx2_nt";
    s.parallel_from = 1 * MiB;
    s.parallel_why = kParallelWhy;
    if (avx512)
        s.notes = {"all three regions share the table: the bands were measured in private memory, and neither kernel "
                   "nor rep movsb showed a shared-memory penalty on Intel",
                   "no rep movsb collapse at 4K-aliasing distances reproduced here (evidence: "
                   "intel-rep-movsb-collapse)"};
    return s;
}

// ---- Any x86-64, with and without AVX2 ---------------------------------------------------
const char* const kX86Libc = "the C library: no other kernel is known to be faster on this kind of CPU";

Spec x86_spec(bool avx2) {
    Spec s{};
    s.name = avx2 ? "x86-avx2" : "x86-64";
    s.arch = "x86_64";
    s.family = -1;
    s.model_lo = s.model_hi = -1;
    s.needs = avx2 ? kMatchAvx2 : 0u;
    s.provenance = {"no measurement of this CPU family: the C library, plus non-temporal stores above half the L3 "
                    "(as on Zen 3 and an Intel Xeon)",
                    "2026-11", "any", "rule of thumb (evidence: zen3-nt-half-l3, intel-nt-cap-64mib)"};
    ClassSpec libc = {{0, "generic", nullptr, kX86Libc}};
    for (auto& r : s.regions) r = {libc, libc, libc, libc, 2112, "FASTCOPY_REP_MOVSB=on: rep movsb in the far class from 2112 B"};
    s.nt = avx2 ? NtKind::HalfL3Cap64M : NtKind::None;
    s.nt_kernel = avx2 ? "avx2_nt" : nullptr;
    s.nt_min_page_distance = 512;  // unmeasured CPUs get the safe side (evidence: zen3-nt-page-distance)
    s.parallel_from = 1 * MiB;
    s.parallel_why = kParallelWhy;
    return s;
}

// ---- aarch64 ---------------------------------------------------------------------------
Spec arm_spec(bool sve) {
    Spec s{};
    s.name = sve ? "aarch64-sve" : "aarch64-neon";
    s.arch = "aarch64";
    s.family = -1;
    s.model_lo = s.model_hi = -1;
    s.needs = sve ? kMatchSve : 0u;
    s.provenance = {sve ? "Fujitsu A64FX figures (published): an SVE loop against glibc's memcpy"
                        : "glibc's aarch64 memcpy already uses 128-bit ASIMD, as the NEON kernel does",
                    "2026-11", "glibc",
                    sve ? "published single-thread bandwidth (evidence: arm-sve-a64fx)" : "none needed"};
    ClassSpec libc = {{0, "generic", nullptr,
                       "the C library: glibc's aarch64 memcpy already uses 128-bit ASIMD; no SVE on this CPU"}};
    ClassSpec sv = {{0, "generic", nullptr, "the C library below 2 KiB"},
                    {2048, "sve", "generic",
                     "SVE loop (vector-length agnostic, 16-256 byte vectors): 2-3x glibc's memcpy where glibc has no "
                     "SVE routine (evidence: arm-sve-a64fx)"}};
    for (auto& r : s.regions) r = {sve ? sv : libc, sve ? sv : libc, sve ? sv : libc, sve ? sv : libc, SIZE_MAX,
                                   "no rep movsb on aarch64"};
    s.nt = NtKind::None;
    s.parallel_from = 1 * MiB;
    s.parallel_why = kParallelWhy;
    // The first SVE instruction after each syscall traps to the kernel (Linux 4.15-6.1); from
    // 256 KiB a copy is long enough for the trap to cost under 10 % (evidence: arm-sve-syscall-trap).
    s.sve_trap_min_from = sve ? 256 * KiB : 0;
    return s;
}

Spec any_spec() {
    Spec s{};
    s.name = "portable";
    s.arch = nullptr;  // any
    s.family = -1;
    s.model_lo = s.model_hi = -1;
    s.provenance = {"any CPU without a more specific profile", "2026-11", "any", "none: the C library everywhere"};
    ClassSpec libc = {{0, "generic", nullptr, "the C library (no faster kernel compiled for this CPU)"}};
    for (auto& r : s.regions) r = {libc, libc, libc, libc, SIZE_MAX, "no rep movsb on this architecture"};
    s.nt = NtKind::None;
    s.parallel_from = 1 * MiB;
    s.parallel_why = kParallelWhy;
    return s;
}

const std::vector<Spec>& specs() {
    static const std::vector<Spec> all = {
        zen3_spec(),
        zen4_spec(),
        other_amd_spec(),
        zen5_spec(),
        intel_spec(false),
        intel_spec(true),
        x86_spec(true),
        x86_spec(false),
        arm_spec(true),
        arm_spec(false),
        any_spec(),
    };
    return all;
}

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

void nt_threshold_for(const Spec& s, const CpuFacts& f, std::size_t& threshold, std::string& why) {
    if (s.nt == NtKind::HalfL3Cap64M) {
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
    } else if (s.nt == NtKind::HalfL3Cap12M) {
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
    } else if (s.nt == NtKind::TwiceL3) {
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

Profile resolve(const Spec& s, const CpuFacts& cpu, int score) {
    Profile p;
    p.name = s.name;
    p.source = "built-in";
    p.matched_why = score >= 0 ? "matched this CPU (" + cpu.vendor + " family " + std::to_string(cpu.family) +
                                     " model " + std::to_string(cpu.model) + ") by: " + match_words(s)
                               : "not the match for this CPU (requested by name): " + match_words(s);
    p.provenance = s.provenance;
    std::size_t nt = SIZE_MAX;
    std::string nt_why;
    nt_threshold_for(s, cpu, nt, nt_why);
    for (int r = 0; r < kRegions; ++r) {
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
                out.nt = {nt, k.fn, k.name, nt_why, s.nt_min_page_distance};
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
    p.parallel = {s.parallel_from, 0, s.parallel_why};
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
        for (std::size_t l3 : {std::size_t(0), 32 * MiB, 512 * MiB}) {
            CpuFacts f;
            f.l3 = l3;
            f.cache_source = "sysfs";
            NtExample e;
            e.l3 = l3;
            nt_threshold_for(s, f, e.threshold, e.why);
            t.nt_examples.push_back(e);
        }
        t.parallel_from = s.parallel_from;
        t.parallel_why = s.parallel_why ? s.parallel_why : "";
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
