// The built-in profiles: one table per CPU family with measurements behind it, each with its
// provenance and the rule that matches it to a CPU (builtin_match.cpp matches and resolves
// them). Reasons cite their evidence by id (docs/evidence/<subject>.md).
#include "builtin_spec.h"

namespace fastcopy {
namespace policy {
namespace builtin {
namespace {

// ---------------------------------------------------------------------------------------
// Reasons. Each says in plain words why the band or rule is what it is and cites the
// measurements behind it (docs/evidence/<subject>.md, printed by `info --verbose`).
const char* const kParallelWhy =
    "two threads gain from 1 MiB back to back and about break even there when the worker sleeps "
    "(evidence: intel-parallel-from-1mib, pool-parallel-threshold)";
const char* const kParallelZen5Why =
    "two threads from 256 KiB, each size class learning split or alone: with the pool from 1 MiB the held-out check "
    "put auto at 0.64-0.80 of two threads at 256 KiB-1.2 MB, from 256 KiB at 0.98-1.02 (evidence: "
    "zen5-parallel-from-256kib, zen5-parallel-from-1mib, policy-private-split); copies into and out of shared memory "
    "from 1 MiB, as measured on Zen 4 (evidence: zen4-shared-parallel-from-1mib)";
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
    "non-temporal stores below 32 MiB only when (dst - src) mod 4096 is 0 or at least 512: they lose at small "
    "distances on Zen 4 too, and one threshold serves every distance; from 32 MiB, split over the pool, they win at "
    "every distance (evidence: zen4-nt-page-distance)";

const char* const kZen4LibcGap =
    "the C library at 448-575 B page-aligned: glibc beats the AVX2 loop there; at other distances the AVX2 loop wins "
    "on the whole (evidence: zen4-libc-448-575)";

const char* const kZen4ParallelWhy =
    "two threads from 256 KiB, each size class learning split or alone: with the pool from 1 MiB the held-out check "
    "put auto at 0.64-0.71 of two threads at 256 KiB-1 MiB, from 256 KiB at 0.99-1.01 (evidence: "
    "zen4-parallel-from-256kib, zen4-parallel-from-1mib, policy-private-split); copies into and out of shared "
    "memory from 1 MiB, where a peer process needs the other vCPU: split from 256 KiB, a Channel's round trip at "
    "512 KiB-2 MiB grew 1.3-1.6x (evidence: zen4-shared-parallel-from-1mib)";

struct AmdTable {
    std::size_t vector_from;  // the AVX2 loop from this size, the C library below
    const char *small, *avx2, *near, *backward, *erms_on;
    // [libc_from, libc_to): the C library again in the page-aligned class (0: none)
    std::size_t libc_from, libc_to;
    const char* libc_why;
    std::size_t parallel_from;  // the thread pool from this size
    const char* parallel_why;   // and why
    // Copies into and out of shared memory on the pool from this size (0: parallel_from); why is
    // in parallel_why.
    std::size_t shared_parallel_from;
};
const AmdTable kZen3Table = {128, kZen3Small, kZen3Avx2, kZen3Near, kZen3Backward, kZen3ErmsOn,
                             0,   0,          nullptr,   1 * MiB,   kParallelWhy, 0};
const AmdTable kZen4Table = {192, kZen4Small, kZen4Avx2,    kZen4Near,  kZen4Backward,   kZen4ErmsOn,
                             448, 576,        kZen4LibcGap, 256 * KiB,  kZen4ParallelWhy, 1 * MiB};

RegionSpec amd_region(const AmdTable& t, bool shared) {
    const ClassSpec far = {{0, "generic", nullptr, t.small}, {t.vector_from, "avx2", "generic", t.avx2}};
    ClassSpec aligned = far;
    if (t.libc_from) {
        aligned.push_back({t.libc_from, "generic", nullptr, t.libc_why});
        aligned.push_back({t.libc_to, "avx2", "generic", t.avx2});
    }
    ClassSpec near = {{0, "generic", nullptr, t.small}, {t.vector_from, "avx2", "generic", t.near}};
    ClassSpec back = {{0, "generic", nullptr, t.small}, {t.vector_from, "avx2", "generic", t.backward}};
    return {aligned, near, far, back, shared ? SIZE_MAX : std::size_t(2112), shared ? kAmdNoErmsShared : t.erms_on};
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
    s.parallel_from = table.parallel_from;
    s.parallel_why = table.parallel_why;
    s.parallel_shared_from = table.shared_parallel_from;
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
    Spec s = amd_spec("amd-zen4", 25, kMatchAvx2 | kMatchAvx512, kZen4Table,
                      {"AMD EPYC family 25 model 17 stepping 1 (Zen 4, Genoa) under KVM, 2 vCPUs, 32 MiB L3",
                       "2026-12-01", "glibc 2.36",
                       "cpp/bench/kernel_bench: kernels interleaved, medians of 9-31 rounds, hot caches (evidence: "
                       "zen4-avx2-from-192, zen4-nt-half-l3)"},
                      {kZen4NoAvx512, kZen4NtDistance});
    s.nt_min_page_distance_below = 32 * MiB;  // evidence: zen4-nt-page-distance
    s.nt_learn_from = 4 * MiB;                // evidence: policy-private-store-modes
    return s;
}

// ---- AMD Zen 5 (family 26) --------------------------------------------------------------
// No 4K-aliasing collapse of rep movsb on Zen 5. The `avx512` bands name a kernel that a build
// or a VM may lack: in the far and page-aligned classes it falls back to glibc, which ties avx2
// there; in the near class to avx2, because glibc runs rep movsb from 2112 B and that is slow at
// distances 1..63 below 24 KiB (evidence: zen5-near-avx512).
const char* const kZen5Avx512 =
    "AVX-512 loop: faster than an AVX2 loop and glibc at 1-16 KiB on Zen 5's full-width units "
    "(evidence: zen5-avx512-2k-24k)";
const char* const kZen5Erms =
    "rep movsb: ties glibc (which runs it) to 1 MiB, wins slightly above, beats the AVX2 loop; no 4K-aliasing "
    "collapse on Zen 5 (evidence: zen5-erms-from-24k)";
const char* const kZen5Near =
    "AVX-512 loop from 2 KiB at (dst - src) mod 4096 in 1..63: 1.2-1.45x the AVX2 loop and 1.2-2.2x glibc (which "
    "runs rep movsb from 2112 B) up to 26 KiB (evidence: zen5-near-avx512)";
const char* const kZen5NearMid =
    "the C library at (dst - src) mod 4096 in 1..63 from 27 KiB: once source and destination outgrow the 48 KiB L1 "
    "it beats the vector loops (evidence: zen5-near-avx512, zen5-near-avx2)";
const char* const kZen5Back =
    "the C library for backward overlaps (no Zen 5 measurement of the vector loops there)";
const char* const kZen5ErmsOn =
    "FASTCOPY_REP_MOVSB=on: rep movsb in the far class from 2112 B (glibc's threshold)";

RegionSpec zen5_region() {
    ClassSpec wide = {{0, "generic", nullptr, kLibcSmall},
                      {2048, "avx512", "generic", kZen5Avx512},
                      {24 * KiB, "erms", "generic", kZen5Erms}};
    ClassSpec near = {{0, "generic", nullptr, kLibcSmall},
                      {2 * KiB, "avx512", "avx2", kZen5Near},
                      {27 * KiB, "generic", nullptr, kZen5NearMid}};
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
    s.provenance = {"AMD EPYC family 26 model 2 stepping 1 (Zen 5, Turin) under KVM, 2 vCPUs, 32 MiB L3",
                    "2026-11; near class and thread pool 2026-12-07", "glibc 2.36",
                    "python -m fastcopy bench with every forced kernel and plain C loops: one thread, hot caches, "
                    "medians of 5-7 interleaved repeats (evidence: zen5-avx512-2k-24k, zen5-erms-from-24k); "
                    "cpp/bench/kernel_bench at distances 1..63 and the held-out check (python -m fastcopy tune "
                    "--check) for the near class and the pool (evidence: zen5-near-avx512, "
                    "zen5-parallel-from-256kib)"};
    for (auto& r : s.regions) r = zen5_region();
    s.nt = NtKind::TwiceL3;
    s.nt_kernel = "avx2_nt";
    s.parallel_from = 256 * KiB;
    s.parallel_shared_from = 1 * MiB;
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
    "the C library below 4 B: at 1-3 B it ran 1.00-1.02x avx512 (evidence: intel-avx512-small)";
const char* const kIntelAvx512 =
    "AVX-512 loop: 1.02-1.07x glibc at 4 B-384 B (evidence: intel-avx512-small), 1.03-1.07x at 256 B-2 KiB (glibc's "
    "own vector loop there) and 1.09-1.21x glibc and rep movsb at 2-8 KiB, 1.01-1.05x at 8-16 KiB (glibc runs rep "
    "movsb from 2112 B); at (dst - src) mod 4096 in 1..63 1.08-1.13x up to 20 KiB (evidence: intel-avx512-band)";
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

const char* const kIntelAvx512Back =
    "AVX-512 loop for overlapping copies of 4 B-1.25 KiB: 1.01-1.07x the C library at 4-250 B (evidence: "
    "intel-avx512-small) and 1.01-1.09x at 314 B-1.17 KiB in every region, a tie from 1.3 to 5 KiB and the C library "
    "1.01-1.06x faster at 6.3-7.9 KiB (evidence: intel-backward-avx512)";
const char* const kIntelBackLibc =
    "the C library for overlapping copies outside 4 B-1.25 KiB: avx512 ties it from 1.3 to 5 KiB and loses at "
    "6.3-7.9 KiB (evidence: intel-backward-avx512); below 4 B see intel-avx512-small";

const char* const kIntelAvx512ParallelWhy =
    "two threads from 384 KiB: split copies ran 1.07-1.8x one thread at 770 KiB-1 MiB (evidence: "
    "intel-parallel-from-512kib); at 384-512 KiB, with private copies learning split or alone, the held-out check put "
    "auto at 0.957-0.961 against 0.904-0.921 on one thread (evidence: intel-parallel-from-384kib); an isolated copy "
    "under 2 MiB runs alone while the workers sleep (evidence: pool-isolated-copies)";

RegionSpec intel_avx512_region() {
    ClassSpec aligned = {{0, "generic", nullptr, kIntelAvx512Small},
                         {4, "avx512", "generic", kIntelAvx512},
                         {16 * KiB, "generic", nullptr, kIntelAlignedMid}};
    ClassSpec near = {{0, "generic", nullptr, kIntelAvx512Small},
                      {4, "avx512", "generic", kIntelAvx512},
                      {21 * KiB, "generic", nullptr, kIntelNearMid}};
    ClassSpec far = {{0, "generic", nullptr, kIntelAvx512Small},
                     {4, "avx512", "generic", kIntelAvx512},
                     {19 * KiB, "erms", "generic", kIntelAvx512Erms}};
    ClassSpec back = {{0, "generic", nullptr, kIntelBackLibc},
                      {4, "avx512", "generic", kIntelAvx512Back},
                      {1280, "generic", nullptr, kIntelBackLibc}};
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
                        "cpp/bench/bandwidth --quick at 4-256 MiB; tune --check from 4 to 256 MiB, hot and cold, for the "
                        "store-mode learning (2026-12-05); figures in docs/evidence/intel.md"};
    else
        s.provenance = {"Intel Xeon (family 6 model 143) under KVM, 2 vCPUs (the development machine before Zen 3); "
                        "glibc's public rep movsb thresholds for CPUs not measured",
                        "2026-11", "glibc 2.36",
                        "python -m fastcopy bench and cpp/bench/bandwidth, medians of 3-9 interleaved repeats, hot "
                        "caches"};
    for (auto& r : s.regions) r = avx512 ? intel_avx512_region() : intel_region();
    s.nt = avx512 ? NtKind::HalfL3Cap12M : NtKind::HalfL3Cap64M;
    if (avx512) {
        s.shared_nt = NtKind::HalfL3Cap64M;
        s.shared_nt_why = "shared memory keeps the 64 MiB cap: the peer holds the other CPU (evidence: intel-nt-shared)";
    }
    s.nt_kernel = avx512 ? "avx512_nt" : "avx2_nt";
    if (avx512) s.nt_learn_from = 4 * MiB;  // evidence: intel-nt-learn
    s.parallel_from = avx512 ? 384 * KiB : 1 * MiB;
    s.parallel_why = avx512 ? kIntelAvx512ParallelWhy : kParallelWhy;
    if (avx512) s.split_learn_from = SIZE_MAX;  // evidence: intel-split-not-learned
    if (avx512)
        s.notes = {"private copies on the pool always split: learning split or alone ran 2 % slower at 384 KiB-1 "
                   "MiB, and the two vCPUs were seen apart in 1 probe row of 585 (evidence: "
                   "intel-split-not-learned)",
                   "all three regions share the bands: they were measured in private memory, and neither kernel "
                   "nor rep movsb showed a shared-memory penalty on Intel; the NT threshold of shared memory differs "
                   "(evidence: intel-nt-shared)",
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


}  // namespace

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

}  // namespace builtin
}  // namespace policy
}  // namespace fastcopy
