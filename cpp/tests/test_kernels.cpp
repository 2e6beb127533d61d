// kernel_tests: one test body, run against every kernel of the registry (all_kernels()) that
// the CPU supports (Highway style), and on x86 also against the ops.h blocks at width 64 on
// two AVX2 halves (ops_width64.cpp: the AVX-512 kernels' logic, on CPUs without AVX-512).
// A kernel the CPU cannot run is reported as "NAME: not tested natively: <why>". Checks memmove semantics against a byte-by-byte reference,
// every size 0..4096 plus large and odd sizes, src/dst misalignments, overlaps in both
// directions, and out-of-range accesses: each buffer sits flush against PROT_NONE guard
// pages on both sides, so a read or write past either end faults.
//
// Options (repeatable where it makes sense):
//   --quick                      smaller matrix (for emulation)
//   --only NAME[,NAME]           test only these kernels
//   --expect-kernel NAME@SIZE    choose_kernel() for a page-aligned disjoint copy of SIZE
//                                bytes (private region) must give kernel NAME
//   --expect-kernel-not NAME@SIZE  ... must not give kernel NAME
//   --expect-supported A,B       these kernels must be compiled in and supported
//   --expect-unsupported A,B     these kernels must be compiled in and NOT supported
//   --expect-sve-bytes N         cpu_facts().sve_vector_bytes must be N
//   --sve-sweep                  (aarch64) also run copy_sve at every vector length the
//                                process can set with prctl(PR_SVE_SET_VL)
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(__aarch64__)
#include <sys/prctl.h>
#ifndef PR_SVE_SET_VL
#define PR_SVE_SET_VL 50
#define PR_SVE_GET_VL 51
#endif
#endif

#include "cpu.h"
#include "core/dispatch.h"
#include "kernels/kernels.h"
#include "kernels/registry.h"
#include "split_list.h"
#if defined(__x86_64__)
#include "ops_direction.h"
#include "ops_width64.h"
#endif

using namespace fastcopy;
using u8 = unsigned char;

namespace {

// ---------------------------------------------------------------------------------------
// Where we are, for the SIGSEGV/SIGBUS handler.
char g_case[256] = "startup";
void set_case(const char* kernel, const char* what, std::size_t n, long a, long b) {
    std::snprintf(g_case, sizeof g_case, "kernel=%s %s n=%zu a=%ld b=%ld", kernel, what, n, a, b);
}
void on_fault(int sig) {
    char buf[400];
    int len = std::snprintf(buf, sizeof buf,
                            "\nkernel_tests: FATAL signal %d (out-of-range access?) during: %s\n",
                            sig, g_case);
    if (len > 0) (void)!write(2, buf, static_cast<std::size_t>(len));
    _exit(3);
}

long g_page = 4096;

// A mapping [guard | usable | guard] with PROT_NONE guard pages.
struct Guarded {
    u8* base = nullptr;  // first usable byte (page-aligned)
    std::size_t size = 0;
    void* map = nullptr;
    std::size_t map_len = 0;
    explicit Guarded(std::size_t usable) {
        size = (usable + g_page - 1) / g_page * g_page;
        map_len = size + 2 * g_page;
        map = mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (map == MAP_FAILED) {
            std::perror("mmap");
            std::exit(2);
        }
        base = static_cast<u8*>(map) + g_page;
        if (mprotect(map, g_page, PROT_NONE) || mprotect(base + size, g_page, PROT_NONE)) {
            std::perror("mprotect");
            std::exit(2);
        }
    }
    ~Guarded() { munmap(map, map_len); }
    Guarded(const Guarded&) = delete;
    Guarded& operator=(const Guarded&) = delete;
    u8* end() const { return base + size; }
    // placement 0: start `off` bytes after the front guard; 1: end `off` bytes before the
    // back guard. off = 0 puts the range flush against the guard.
    u8* place(std::size_t n, std::size_t off, int placement) const {
        return placement == 0 ? base + off : end() - n - off;
    }
};

// Deterministic pseudo-random bytes, generated once byte by byte; each case copies from a
// different offset into it, and checks results with memcmp against it (fast under emulation).
std::vector<u8> g_pat;
void make_pattern(std::size_t n) {
    g_pat.resize(n);
    std::uint32_t x = 2463534242u;
    for (auto& b : g_pat) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        b = static_cast<u8>(x >> 11);
    }
}
inline const u8* pat_at(unsigned seed) { return g_pat.data() + (seed * 977u) % 65536u; }

// Byte-by-byte reference memmove.
void ref_memmove(u8* d, const u8* s, std::size_t n) {
    if (d < s) {
        for (std::size_t i = 0; i < n; ++i) d[i] = s[i];
    } else if (d > s) {
        for (std::size_t i = n; i-- > 0;) d[i] = s[i];
    }
}

struct Ctx {
    const KernelInfo* k = nullptr;
    long checks = 0, failures = 0;
    int printed = 0;
    void fail(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
};

void Ctx::fail(const char* fmt, ...) {
    ++failures;
    if (printed++ >= 20) return;
    std::va_list ap;
    va_start(ap, fmt);
    std::fprintf(stdout, "  FAIL [%s] ", k->name.c_str());
    std::vfprintf(stdout, fmt, ap);
    std::fprintf(stdout, "\n");
    va_end(ap);
}

constexpr std::size_t kMargin = 64;  // bytes checked around dst for stray writes

// One disjoint copy: src and dst in separate guarded mappings.
void disjoint_case(Ctx& c, Guarded& gs, Guarded& gd, std::size_t n, std::size_t soff,
                   std::size_t doff, int splace, int dplace) {
    u8* s = gs.place(n, soff, splace);
    u8* d = gd.place(n, doff, dplace);
    u8* lo = d - kMargin < gd.base ? gd.base : d - kMargin;
    u8* hi = d + n + kMargin > gd.end() ? gd.end() : d + n + kMargin;
    const u8* want = pat_at(static_cast<unsigned>(n * 31 + soff * 7 + doff));
    std::memcpy(s, want, n);
    std::memset(lo, 0xA5, static_cast<std::size_t>(hi - lo));
    c.k->fn(d, s, n);
    ++c.checks;
    long bad = -1;
    for (u8* p = lo; p < d && bad < 0; ++p)
        if (*p != 0xA5) bad = static_cast<long>(p - d);
    for (u8* p = d + n; p < hi && bad < 0; ++p)
        if (*p != 0xA5) bad = static_cast<long>(p - d);
    if (bad < 0 && std::memcmp(d, want, n) != 0)
        for (std::size_t i = 0; i < n && bad < 0; ++i)
            if (d[i] != want[i]) bad = static_cast<long>(i);
    if (bad >= 0) {
        const bool inside = bad >= 0 && static_cast<std::size_t>(bad) < n;
        c.fail("disjoint n=%zu soff=%zu doff=%zu place=%d/%d: byte %ld (rel. dst) is %u, want %u", n, soff,
               doff, splace, dplace, bad, d[bad], inside ? want[bad] : 0xA5);
        return;
    }
    if (std::memcmp(s, want, n) != 0) c.fail("disjoint n=%zu soff=%zu doff=%zu: source changed", n, soff, doff);
}

// One overlapping copy inside a single guarded mapping: dst = src + shift (shift may be
// negative). The span [min(src,dst), max(src,dst)+n) is placed flush against a guard.
void overlap_case(Ctx& c, Guarded& g, std::vector<u8>& expect, std::size_t n, long shift,
                  std::size_t off, int placement) {
    const std::size_t dist = static_cast<std::size_t>(shift < 0 ? -shift : shift);
    const std::size_t span = n + dist;
    u8* lo_span = g.place(span, off, placement);
    u8* s = shift >= 0 ? lo_span : lo_span + dist;
    u8* d = shift >= 0 ? lo_span + dist : lo_span;
    u8* lo = lo_span - kMargin < g.base ? g.base : lo_span - kMargin;
    u8* hi = lo_span + span + kMargin > g.end() ? g.end() : lo_span + span + kMargin;
    const std::size_t w = static_cast<std::size_t>(hi - lo);
    std::memcpy(lo, pat_at(static_cast<unsigned>(n * 13 + dist * 5 + off)), w);
    expect.assign(lo, lo + w);
    ref_memmove(expect.data() + (d - lo), expect.data() + (s - lo), n);
    c.k->fn(d, s, n);
    ++c.checks;
    if (std::memcmp(lo, expect.data(), w) != 0) {
        std::size_t i = 0;
        while (lo[i] == expect[i]) ++i;
        c.fail("overlap n=%zu shift=%ld off=%zu place=%d: byte %ld (rel. dst) is %u, want %u", n,
               shift, off, placement, static_cast<long>((lo + i) - d), lo[i], expect[i]);
    }
}

struct Options {
    bool quick = false;
    bool sve_sweep = false;
    std::vector<std::string> only, expect_supported, expect_unsupported;
    std::vector<std::pair<std::string, std::size_t>> expect_kernel, expect_kernel_not;
    long expect_sve_bytes = -1;
};

// The whole matrix for one kernel.
void run_kernel(Ctx& c, const Options& o, Guarded& gs, Guarded& gd, Guarded& go) {
    std::vector<u8> expect;
    // 1. Every size 0..4096. Small sizes: all 64x64 src/dst misalignments (quick: all 64
    //    of each, paired in rotation); larger: a rotating sample; both placements.
    const std::size_t dense = 300;
    for (std::size_t n = 0; n <= 4096; ++n) {
        set_case(c.k->name.c_str(), "disjoint", n, 0, 0);
        if (n < dense) {
            for (std::size_t sa = 0; sa < 64; ++sa) {
                if (!o.quick) {
                    for (std::size_t da = 0; da < 64; ++da)
                        disjoint_case(c, gs, gd, n, sa, da, static_cast<int>((sa ^ da) & 1),
                                      static_cast<int>(((sa ^ da) >> 1) & 1));
                } else {
                    const std::size_t da = (sa * 5 + n) & 63;
                    disjoint_case(c, gs, gd, n, sa, da, static_cast<int>(sa & 1), static_cast<int>(n & 1));
                    disjoint_case(c, gs, gd, n, da, sa, static_cast<int>(~sa & 1), static_cast<int>(~n & 1));
                }
            }
            for (int sp = 0; sp < 2; ++sp)
                for (int dp = 0; dp < 2; ++dp) disjoint_case(c, gs, gd, n, 0, 0, sp, dp);
        } else {
            const std::size_t r = n * 7;
            const std::size_t pairs[][2] = {{0, 0}, {r & 63, 0}, {0, r & 63}, {1, 63}, {63, 1},
                                            {32, 0}, {(r * 3) & 63, (r * 11) & 63}, {16, 48}};
            const std::size_t np = o.quick ? 2 : 8;
            for (std::size_t p = 0; p < np; ++p) {
                const std::size_t q = (p + n) % 8;
                for (int pl = 0; pl < (o.quick ? 1 : 4); ++pl)
                    disjoint_case(c, gs, gd, n, pairs[q][0], pairs[q][1],
                                  o.quick ? static_cast<int>(n & 1) : (pl & 1),
                                  o.quick ? static_cast<int>((n >> 1) & 1) : (pl >> 1));
            }
        }
    }
    // 2. Large and odd sizes.
    std::vector<std::size_t> big = {4097, 4099, 5000, 8191, 8192, 8193, 12345, 16383, 16384, 16385, 16447,
                                    16448, 20000, 32769, 49151, 65535, 65536, 65537,
                                    (1u << 20) + 13, 3u << 20};
    if (!o.quick) {
        big.push_back((1u << 20) - 1);
        big.push_back((5u << 20) + 4093);
        big.push_back(8u << 20);
    }
    for (std::size_t n : big) {
        set_case(c.k->name.c_str(), "disjoint-large", n, 0, 0);
        const std::size_t pairs[][2] = {{0, 0}, {16, 0}, {0, 16}, {1, 63}, {33, 7}};
        for (auto& p : pairs)
            for (int pl = 0; pl < 4; ++pl) {
                if (o.quick && static_cast<std::size_t>(pl) != ((p[0] + p[1]) & 3)) continue;
                disjoint_case(c, gs, gd, n, p[0], p[1], pl & 1, pl >> 1);
            }
    }
    // 3. Destinations that cross a 4 KiB page boundary `k` bytes before it, up to 1 KiB, for
    //    every k up to 130 and a few more: disjoint (a kernel may copy such a range in two
    //    parts that meet at the boundary) and overlapping in both directions (kept whole).
    for (std::size_t n = 2; n <= 1024; n += (o.quick ? 7 : n < 600 ? 1 : 37)) {
        set_case(c.k->name.c_str(), "page-crossing", n, 0, 0);
        const std::size_t step = o.quick ? 9 : 1;
        std::vector<std::size_t> ks;
        for (std::size_t k = 1; k < n && k <= 130; k += step) ks.push_back(k);
        for (std::size_t k : {n / 2, n - 64, n - 33, n - 1})
            if (k >= 1 && k < n) ks.push_back(k);
        for (std::size_t k : ks) {
            disjoint_case(c, gs, gd, n, (n * 3 + k) & 63, 4096 - k, 0, 0);
            for (const std::size_t dist : {std::size_t{1}, std::size_t{16}, n / 2, n - 1}) {
                if (dist < 1 || dist >= n || dist > 4096 - k) continue;
                overlap_case(c, go, expect, n, static_cast<long>(dist), 4096 - k - dist, 0);  // dst = src + dist
                overlap_case(c, go, expect, n, -static_cast<long>(dist), 4096 - k, 0);       // dst = src - dist
            }
        }
    }
    // 4. Overlaps in both directions at many distances.
    std::vector<std::size_t> osizes;
    for (std::size_t n = 0; n <= (o.quick ? 300u : 600u); ++n) osizes.push_back(n);
    for (std::size_t n = 601; n <= 4096; n += (o.quick ? 97 : 31)) osizes.push_back(n);
    for (std::size_t n : {4096u, 4097u, 8191u, 65537u}) osizes.push_back(n);
    if (!o.quick) osizes.push_back((1u << 20) + 13);
    for (std::size_t n : osizes) {
        std::vector<std::size_t> dists;
        const std::size_t maxd = o.quick ? 40 : 64;
        const std::size_t step = (n > 1024 && o.quick) ? 7 : 1;
        for (std::size_t dd = 1; dd <= maxd; dd += step) dists.push_back(dd);
        for (std::size_t dd : {n - 1, n / 2, n - 31, n + 0, n + 1, std::size_t{128}, std::size_t{255},
                               std::size_t{4095}, std::size_t{4096}})
            if (dd >= 1 && dd <= n + 1 && dd < (std::size_t{1} << 21)) dists.push_back(dd);
        if (n >= (std::size_t{1} << 20) || (n > 4096 && o.quick)) dists.resize(dists.size() > 12 ? 12 : dists.size());
        for (std::size_t dd : dists) {
            for (int sign = -1; sign <= 1; sign += 2) {
                const long shift = sign * static_cast<long>(dd);
                set_case(c.k->name.c_str(), "overlap", n, shift, 0);
                const std::size_t off = (n + dd) & 63;
                overlap_case(c, go, expect, n, shift, 0, (n + dd) & 1);
                overlap_case(c, go, expect, n, shift, off, static_cast<int>(~(n + dd) & 1));
            }
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    auto need = [&](int& i) -> std::string {
        if (i + 1 >= argc) {
            std::fprintf(stderr, "kernel_tests: %s needs a value\n", argv[i]);
            std::exit(2);
        }
        return argv[++i];
    };
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--quick") o.quick = true;
        else if (a == "--sve-sweep") o.sve_sweep = true;
        else if (a == "--only") for (auto& s : split_list(need(i))) o.only.push_back(s);
        else if (a == "--expect-supported") for (auto& s : split_list(need(i))) o.expect_supported.push_back(s);
        else if (a == "--expect-unsupported") for (auto& s : split_list(need(i))) o.expect_unsupported.push_back(s);
        else if (a == "--expect-sve-bytes") o.expect_sve_bytes = std::atol(need(i).c_str());
        else if (a == "--expect-kernel" || a == "--expect-kernel-not") {
            std::string v = need(i);
            auto at = v.find('@');
            if (at == std::string::npos) {
                std::fprintf(stderr, "kernel_tests: %s wants NAME@SIZE, got %s\n", a.c_str(), v.c_str());
                return 2;
            }
            (a == "--expect-kernel" ? o.expect_kernel : o.expect_kernel_not)
                .emplace_back(v.substr(0, at), parse_size(v.substr(at + 1)));
        } else if (a == "-h" || a == "--help") {
            std::printf("usage: kernel_tests [--quick] [--only K,..] [--sve-sweep] [--expect-kernel NAME@SIZE]...\n"
                        "       [--expect-supported K,..] [--expect-unsupported K,..] [--expect-sve-bytes N]\n");
            return 0;
        } else {
            std::fprintf(stderr, "kernel_tests: unknown option %s (try --help)\n", a.c_str());
            return 2;
        }
    }
    g_page = sysconf(_SC_PAGESIZE);
    struct sigaction sa {};
    sa.sa_handler = on_fault;
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
    std::setvbuf(stdout, nullptr, _IOLBF, 0);

    long passed = 0, failed = 0;
    // KERNEL_TESTS_STOP_AT_FIRST_FAILURE=1 (set by the mutation check): the first failed check
    // ends the run, as only whether it fails matters there (evidence:
    // testing-mutation-per-mutant-costs).
    const char* stop_env = std::getenv("KERNEL_TESTS_STOP_AT_FIRST_FAILURE");
    const bool stop_at_first_failure = stop_env && std::string(stop_env) == "1";
    auto check = [&](bool ok, const std::string& what) {
        std::printf("  %s %s\n", ok ? "ok  " : "FAIL", what.c_str());
        (ok ? passed : failed)++;
        if (!ok && stop_at_first_failure) {
            std::printf("kernel_tests: stopped at the first failure (KERNEL_TESTS_STOP_AT_FIRST_FAILURE=1)\n");
            std::exit(1);
        }
    };

    init_policy();
    const CpuFacts& f = cpu_facts();
    std::printf("== CPU facts\n");
    std::printf("  arch=%s vendor=%s family=%u model=%u stepping=%u hypervisor=%d\n", f.arch.c_str(),
                f.vendor.c_str(), f.family, f.model, f.stepping, f.hypervisor);
    std::printf("  x86: erms=%d fsrm=%d avx=%d avx2=%d avx512f=%d avx512bw=%d avx512vl=%d\n", f.erms, f.fsrm,
                f.avx, f.avx2, f.avx512f, f.avx512bw, f.avx512vl);
    std::printf("  caches: l1d=%zu l2=%zu l3=%zu (cpuid %zu, sysfs %zu, source %s)\n", f.l1d, f.l2, f.l3,
                f.l3_cpuid, f.l3_sysfs, f.cache_source.c_str());
    std::printf("  arm: asimd=%d sve=%d sve2=%d mops=%d sve_vector_bytes=%zu midr=%d:0x%x/0x%x\n", f.asimd, f.sve,
                f.sve2, f.mops, f.sve_vector_bytes, f.midr_known, f.midr_implementer, f.midr_part);
    std::printf("  os: linux %d.%d sve_traps_after_syscall=%d usable_cpus=%u\n", f.kernel_major, f.kernel_minor,
                f.sve_traps_after_syscall, f.usable_cpus);

    std::printf("== Kernels compiled in\n");
    for (const auto& k : all_kernels())
        std::printf("  %-9s %s%s%s\n", k.name.c_str(), k.supported ? "supported" : "NOT supported",
                    k.supported ? "" : ": ", k.why_not.c_str());

    // choose_kernel for a few sizes, page-aligned disjoint buffers (no memory is touched).
    const std::size_t probe_max = std::size_t{1} << 30;
    std::size_t choose_max = probe_max;
    for (auto& e : o.expect_kernel) choose_max = e.second > choose_max ? e.second : choose_max;
    void* cs = mmap(nullptr, choose_max, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void* cd = mmap(nullptr, choose_max, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (cs == MAP_FAILED || cd == MAP_FAILED) {
        std::perror("mmap (choose_kernel probes)");
        return 2;
    }
    std::printf("== choose_kernel (private, page-aligned, disjoint)\n");
    for (std::size_t n : {std::size_t{0}, std::size_t{64}, std::size_t{1024}, std::size_t{4096},
                          std::size_t{65536}, std::size_t{1} << 20, std::size_t{16} << 20,
                          std::size_t{256} << 20}) {
        std::printf("  %10zu B -> %s (to_shared %s, from_shared %s)\n", n,
                    kernel_name(choose_kernel(cd, cs, n, Region::Private)),
                    kernel_name(choose_kernel(cd, cs, n, Region::ToShared)),
                    kernel_name(choose_kernel(cd, cs, n, Region::FromShared)));
    }

    std::printf("== Registry\n");
    {
        // The registry is the only list of kernels: dispatch's table must follow it, names are
        // unique, and every twin is a kernel with the other streaming flag and the same needs
        // that names this one back.
        const auto& reg = kernel_registry();
        std::string bad;
        bool same = reg.size() == all_kernels().size();
        for (std::size_t i = 0; i < reg.size(); ++i) {
            const KernelEntry& e = reg[i];
            std::printf("  %-9s streaming=%d twin=%s\n", e.name, e.streaming, e.twin ? e.twin : "-");
            if (same && all_kernels()[i].name != e.name) same = false;
            for (std::size_t j = 0; j < i; ++j)
                if (std::string(reg[j].name) == e.name) bad += std::string(" duplicate ") + e.name + ";";
            if (!e.fn) bad += std::string(" ") + e.name + " has no function;";
            // FASTCOPY_KERNEL_ALIGN: every kernel starts on a 64-byte line.
            if (e.fn && reinterpret_cast<std::uintptr_t>(e.fn) % 64 != 0)
                bad += std::string(" ") + e.name + " does not start on a 64-byte line;";
            if (!e.twin) continue;
            const KernelEntry* t = nullptr;
            for (const auto& x : reg)
                if (std::string(x.name) == e.twin) t = &x;
            if (!t) bad += std::string(" ") + e.name + "'s twin " + e.twin + " is not registered;";
            else if (t->streaming == e.streaming || t->needs != e.needs || !t->twin || std::string(t->twin) != e.name)
                bad += std::string(" ") + e.name + " and " + e.twin + " are not twins;";
        }
        check(same, "dispatch's kernel table lists the registry's kernels in its order");
        check(bad.empty(), "registry names unique, functions set and 64-byte aligned, twins consistent" + (bad.empty() ? "" : ":" + bad));
        // Synthetic CPUs: the AVX-512 kernels use F, BW and VL instructions, so one missing
        // part (F alone: Knights Landing) must not count as AVX-512.
        CpuFacts part{};
        part.avx2 = true;
        part.avx512f = true;
        check((cpu_features(part) & kNeedsAvx512) == 0, "AVX-512 F without BW and VL is not AVX-512");
        part.avx512bw = true;
        check((cpu_features(part) & kNeedsAvx512) == 0, "AVX-512 F and BW without VL is not AVX-512");
        part.avx512vl = true;
        check((cpu_features(part) & kNeedsAvx512) != 0, "AVX-512 F, BW and VL is AVX-512");
        check((cpu_features(part) & kNeedsAvx2) != 0, "AVX2 flag gives the AVX2 bit");
    }
    std::printf("== Environment expectations\n");
    for (auto& e : o.expect_kernel) {
        const char* got = kernel_name(choose_kernel(cd, cs, e.second, Region::Private));
        check(e.first == got, "choose_kernel(" + std::to_string(e.second) + " B) = " + got + ", expected " + e.first);
    }
    for (auto& e : o.expect_kernel_not) {
        const char* got = kernel_name(choose_kernel(cd, cs, e.second, Region::Private));
        check(e.first != got, "choose_kernel(" + std::to_string(e.second) + " B) = " + got + ", expected not " + e.first);
    }
    {
        // Always: whatever the policy picks is a kernel this CPU supports, for any size,
        // region and address offset (including overlapping ranges).
        std::string bad;
        int probes = 0;
        for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{64}, std::size_t{2048}, std::size_t{2112},
                              std::size_t{4096}, std::size_t{65536}, std::size_t{1} << 20, std::size_t{16} << 20,
                              std::size_t{256} << 20, std::size_t{1} << 30})
            for (std::size_t off : {std::size_t{0}, std::size_t{16}, std::size_t{64}, std::size_t{4095}})
                for (int r = 0; r < 3; ++r)
                    for (int ov = 0; ov < 3; ++ov) {
                        // ov 0: disjoint; 1: dst = src + off (overlap forward); 2: src = dst + off
                        char* base = static_cast<char*>(cd);
                        void* d = ov == 2 ? static_cast<void*>(base) : static_cast<void*>(base + off);
                        const void* sp = ov == 0 ? static_cast<const void*>(static_cast<char*>(cs))
                                                 : static_cast<const void*>(ov == 1 ? base : base + off);
                        const char* name = kernel_name(choose_kernel(d, sp, n, static_cast<Region>(r)));
                        const KernelInfo* k = find_kernel(name);
                        ++probes;
                        if (!k || !k->supported)
                            bad += std::string(bad.empty() ? "" : ", ") + name + "@" + std::to_string(n);
                    }
        check(bad.empty(), "choose_kernel picks supported kernels only (" + std::to_string(probes) + " probes)" +
                               (bad.empty() ? "" : ": got " + bad));
    }
    for (auto& name : o.expect_supported) {
        const KernelInfo* k = find_kernel(name);
        check(k && k->supported, "kernel " + name + (k ? (k->supported ? " supported" : " not supported: " + k->why_not)
                                                       : " not compiled in") + ", expected supported");
    }
    for (auto& name : o.expect_unsupported) {
        const KernelInfo* k = find_kernel(name);
        check(k && !k->supported, "kernel " + name + (k ? (k->supported ? " supported" : " not supported") : " not compiled in") +
                                      ", expected compiled in but not supported");
    }
    if (o.expect_sve_bytes >= 0)
        check(static_cast<long>(f.sve_vector_bytes) == o.expect_sve_bytes,
              "sve_vector_bytes = " + std::to_string(f.sve_vector_bytes) + ", expected " +
                  std::to_string(o.expect_sve_bytes));
    munmap(cs, choose_max);
    munmap(cd, choose_max);

    // Buffers: 16 MiB each is more than the largest case (8 MiB + margins).
    Guarded gs(16u << 20), gd(16u << 20), go(16u << 20);
    make_pattern((16u << 20) + 65536u);

    std::printf("== Kernel tests (%s matrix)\n", o.quick ? "quick" : "full");
    auto want = [&](const std::string& name) {
        if (o.only.empty()) return true;
        for (auto& s : o.only)
            if (s == name) return true;
        return false;
    };
    int ran = 0;
    auto run_one = [&](const KernelInfo& k, const std::string& what) {
        Ctx c;
        c.k = &k;
        auto t0 = std::chrono::steady_clock::now();
        run_kernel(c, o, gs, gd, go);
        double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        check(c.failures == 0, k.name + what + ": " + std::to_string(c.checks) + " copies (sizes 0..4096 and large, "
                                   "misalignments 0..63, overlaps both ways, guard pages), " +
                                   std::to_string(c.failures) + " wrong, " + std::to_string(sec).substr(0, 5) + " s");
        ++ran;
    };
    for (const auto& k : all_kernels()) {
        if (!want(k.name)) continue;
        if (!k.supported) {
            std::printf("  %s: not tested natively: %s\n", k.name.c_str(), k.why_not.c_str());
            continue;
        }
        run_one(k, "");
    }
#if defined(__x86_64__)
    // The AVX-512 kernels' blocks at width 64 on two AVX2 halves (--only avx512 / avx512_nt
    // selects them too). Natively-run AVX-512 kernels above cover the intrinsics as well.
    {
        const bool avx2 = (cpu_features(f) & kNeedsAvx2) != 0;
        const std::pair<const char*, KernelInfo> width64[] = {
            {"avx512", KernelInfo{"avx512@2xavx2", "ops.h width 64 on two AVX2 halves", fastcopy_test::copy_width64, avx2, ""}},
            {"avx512_nt", KernelInfo{"avx512_nt@2xavx2", "ops.h streaming width 64 on two AVX2 halves",
                                     fastcopy_test::copy_width64_nt, avx2, ""}},
        };
        for (const auto& w : width64) {
            if (!want(w.first) && !want(w.second.name)) continue;
            if (!avx2) {
                std::printf("  %s: skipped: needs AVX2 for its two 32-byte halves\n", w.second.name.c_str());
                continue;
            }
            run_one(w.second, " (the " + std::string(w.first) + " blocks at width 64, emulated with two AVX2 halves)");
        }
        // Disjoint copies of 65-512 B whose destination crosses a page make no 64-byte store
        // across the boundary (vec::Avx512::kSplitSmallCopiesAtPages: such a store is slow);
        // overlapping ones stay whole and may.
        if (avx2 && (want("avx512") || want("avx512@2xavx2"))) {
            std::printf("== avx512@2xavx2: no store straddles a page in a disjoint copy of 65-512 B\n");
            std::vector<u8> src(512), page(3 * 4096);
            u8* boundary = page.data() + 4096 + ((0u - reinterpret_cast<std::uintptr_t>(page.data())) & 4095u);
            std::size_t straddled = 0, copies = 0, wrong = 0;
            for (std::size_t n = 65; n <= 512; ++n)
                for (std::size_t k = 1; k < n; k += (n < 130 ? 1 : 7)) {
                    for (std::size_t i = 0; i < n; ++i) src[i] = static_cast<u8>(n + k + i);
                    fastcopy_test::width64_page_straddling_stores();
                    fastcopy_test::copy_width64(boundary - k, src.data(), n);
                    straddled += fastcopy_test::width64_page_straddling_stores();
                    wrong += std::memcmp(boundary - k, src.data(), n) != 0;
                    ++copies;
                }
            check(straddled == 0 && wrong == 0, std::to_string(copies) + " copies: " + std::to_string(straddled) +
                                                   " straddling stores, " + std::to_string(wrong) + " wrong");
            // The counter sees straddles: one overlapping copy across the boundary makes some.
            fastcopy_test::width64_page_straddling_stores();
            fastcopy_test::copy_width64(boundary - 100, boundary - 99, 200);
            check(fastcopy_test::width64_page_straddling_stores() > 0,
                  "an overlapping copy across the boundary stays whole (its stores straddle)");
        }
    }
#endif
#if defined(__x86_64__)
    // Loop direction of disjoint copies by page distance: backward at 1..255 under the AVX2
    // trait's rule (4K aliasing), forward at 0 and from 256, and always forward without the
    // rule; the bytes are right either way.
    if (o.only.empty()) {
        std::printf("== loop direction of disjoint copies (ops.h at width 32, recorded stores)\n");
        const std::size_t n = 2048;
        std::vector<u8> buf(5 * 4096 + n + 4096);
        u8* src = buf.data() + ((0u - reinterpret_cast<std::uintptr_t>(buf.data())) & 4095u) + 96;
        for (std::size_t i = 0; i < n; ++i) src[i] = static_cast<u8>(i * 7 + 3);
        for (const std::size_t distance : {0, 1, 31, 100, 255, 256, 300, 4095}) {
            for (const bool rule : {true, false}) {
                u8* dst = src + 2 * 4096 + distance;
                std::memset(dst, 0, n);
                const std::vector<std::size_t> at = fastcopy_test::loop_store_offsets(dst, src, n, rule);
                const bool increasing = at.size() > 1 && std::is_sorted(at.begin(), at.end());
                const bool decreasing = at.size() > 1 && std::is_sorted(at.rbegin(), at.rend());
                const bool backward_expected = rule && distance != 0 && distance < 256;
                check(std::memcmp(dst, src, n) == 0 && (backward_expected ? decreasing : increasing),
                      std::string(rule ? "with" : "without") + " the AVX2 trait's rule, page distance " +
                          std::to_string(distance) + ": " + (backward_expected ? "backward" : "forward") +
                          " loop (" + std::to_string(at.size()) + " loop stores), bytes right");
            }
        }
    }
#endif
#if defined(__aarch64__)
    if (o.sve_sweep) {
        const KernelInfo* k = find_kernel("sve");
        if (!k || !k->supported) {
            std::printf("  --sve-sweep: no SVE here, nothing to sweep\n");
        } else {
            const int orig = prctl(PR_SVE_GET_VL, 0, 0, 0, 0);
            Options q = o;
            q.quick = true;
            for (int vl = 16; vl <= 256; vl += 16) {
                int r = prctl(PR_SVE_SET_VL, vl, 0, 0, 0);
                if (r < 0 || (r & 0xffff) != vl) continue;  // length not offered by this CPU
                Ctx c;
                c.k = k;
                run_kernel(c, q, gs, gd, go);
                check(c.failures == 0, "sve at vector length " + std::to_string(vl) + " B: " +
                                           std::to_string(c.checks) + " copies, " + std::to_string(c.failures) + " wrong");
            }
            if (orig > 0) prctl(PR_SVE_SET_VL, orig & 0xffff, 0, 0, 0);
        }
    }
#endif
    if (ran == 0) check(false, "no kernel was tested (check --only)");
    std::printf("kernel_tests: %ld passed, %ld failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
