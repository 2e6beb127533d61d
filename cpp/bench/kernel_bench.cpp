// Single-thread copy-kernel micro-benchmark (not a test; built with -DFASTCOPY_BUILD_BENCH=ON).
// For each size, each source offset within its page and each (dst - src) page offset, runs
// every kernel interleaved (kernel A, B, C, ... then again, the order rotating each round),
// many rounds, and prints the median
// bandwidth in GB/s (1e9 B/s, bytes copied per second) and, per kernel, the median over
// rounds of its ratio to the first kernel in the same round. Paired ratios keep the
// comparison fair on a noisy, shared machine (load that drifts over the run cancels out):
// compare ratios within one run, not absolute figures.
//
//   kernel_bench [--sizes 4K,64K,1M,16M,256M] [--offsets 0,16,64] [--src-offsets 0,4000]
//                [--rounds N] [--kernels memcpy,NAME,...] [--min-ms MS]
// --src-offsets (default 0): where the source starts within its 4 KiB page; the destination
// keeps (dst - src) mod 4096 == offset. A source offset near 4096 makes a small copy cross a
// page boundary.
// By default: memcpy, then every kernel of the registry this CPU supports (the first one
// named is the reference of the ratios).
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/dispatch.h"
#include "kernels/kernels.h"
#include "split_list.h"

using namespace fastcopy;

namespace {

void* (*volatile g_memcpy)(void*, const void*, std::size_t) = std::memcpy;
void libc_memcpy(void* d, const void* s, std::size_t n) { g_memcpy(d, s, n); }

struct K {
    std::string name;
    CopyFn fn;
};

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::size_t> sizes = {4u << 10, 64u << 10, 1u << 20, 16u << 20, 256u << 20};
    std::vector<std::size_t> offsets = {0, 16, 64};
    std::vector<std::size_t> src_offsets = {0};
    std::vector<std::string> names = {"memcpy"};
    for (const KernelInfo& k : all_kernels())
        if (k.supported) names.push_back(k.name);
    int rounds = 15;
    double min_ms = 2.0;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", a.c_str()); std::exit(2); }
            return argv[++i];
        };
        if (a == "--sizes") { sizes.clear(); for (auto& s : split_list(val())) sizes.push_back(parse_size(s)); }
        else if (a == "--offsets") { offsets.clear(); for (auto& s : split_list(val())) offsets.push_back(std::stoul(s)); }
        else if (a == "--src-offsets") {
            src_offsets.clear();
            for (auto& s : split_list(val())) {
                src_offsets.push_back(std::stoul(s));
                if (src_offsets.back() >= 4096) { std::fprintf(stderr, "--src-offsets: %s is not below 4096\n", s.c_str()); return 2; }
            }
        }
        else if (a == "--kernels") names = split_list(val());
        else if (a == "--rounds") rounds = std::atoi(val().c_str());
        else if (a == "--min-ms") min_ms = std::atof(val().c_str());
        else { std::fprintf(stderr, "unknown option %s\n", a.c_str()); return 2; }
    }
    std::vector<K> ks;
    for (auto& n : names) {
        if (n == "memcpy") { ks.push_back({n, libc_memcpy}); continue; }
        const KernelInfo* k = find_kernel(n);
        if (!k) { std::fprintf(stderr, "no kernel %s in this build\n", n.c_str()); return 2; }
        if (!k->supported) { std::printf("# skipping %s: %s\n", n.c_str(), k->why_not.c_str()); continue; }
        ks.push_back({n, k->fn});
    }
    std::size_t maxn = *std::max_element(sizes.begin(), sizes.end());
    std::size_t maxoff = offsets.empty() ? 0 : *std::max_element(offsets.begin(), offsets.end());
    std::size_t len = maxn + maxoff + 2 * 8192;
    auto* src = static_cast<unsigned char*>(mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    auto* dst = static_cast<unsigned char*>(mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (src == MAP_FAILED || dst == MAP_FAILED) { std::perror("mmap"); return 2; }
    std::memset(src, 1, len);
    std::memset(dst, 2, len);

    std::printf("%-10s %-6s %-6s", "size", "src", "offset");
    for (auto& k : ks) std::printf(" %9s", k.name.c_str());
    for (std::size_t j = 1; j < ks.size(); ++j) std::printf(" %9s", (ks[j].name + "/" + ks[0].name).substr(0, 9).c_str());
    std::printf("   (GB/s medians of %d interleaved rounds; medians of per-round ratios vs %s)\n", rounds, ks[0].name.c_str());
    using clk = std::chrono::steady_clock;
    std::vector<std::pair<std::size_t, std::size_t>> placements;  // (source offset in its page, distance)
    for (std::size_t soff : src_offsets)
        for (std::size_t off : offsets) placements.emplace_back(soff, off);
    for (std::size_t n : sizes) {
        for (const auto& [soff, off] : placements) {
            unsigned char* d = dst + soff + off;  // src, dst page-aligned: (dst - src) mod 4096 == off
            unsigned char* s = src + soff;
            // Calibrate repetitions so one sample takes about min_ms.
            std::size_t reps = 1;
            for (;;) {
                auto t0 = clk::now();
                for (std::size_t r = 0; r < reps; ++r) ks[0].fn(d, s, n);
                double ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
                if (ms >= min_ms || reps >= (std::size_t{1} << 24)) break;
                reps *= 2;
            }
            std::vector<std::vector<double>> gbs(ks.size());
            for (int r = 0; r < rounds; ++r)
                for (std::size_t k = 0; k < ks.size(); ++k) {
                    const std::size_t j = (k + static_cast<std::size_t>(r)) % ks.size();
                    ks[j].fn(d, s, n);  // warm
                    auto t0 = clk::now();
                    for (std::size_t q = 0; q < reps; ++q) ks[j].fn(d, s, n);
                    double sec = std::chrono::duration<double>(clk::now() - t0).count();
                    gbs[j].push_back(double(n) * double(reps) / sec / 1e9);
                }
            auto median = [](std::vector<double> v) {
                std::sort(v.begin(), v.end());
                return v[v.size() / 2];
            };
            std::vector<double> med, ratio;
            for (std::size_t j = 0; j < ks.size(); ++j) {
                med.push_back(median(gbs[j]));
                std::vector<double> per_round;
                for (int r = 0; r < rounds; ++r) per_round.push_back(gbs[j][r] / gbs[0][r]);
                ratio.push_back(median(per_round));
            }
            std::string sz = n >= (1u << 20) && n % (1u << 20) == 0 ? std::to_string(n >> 20) + "M"
                             : n >= 1024 && n % 1024 == 0         ? std::to_string(n >> 10) + "K"
                                                                  : std::to_string(n);
            std::printf("%-10s %-6zu %-6zu", sz.c_str(), soff, off);
            for (double m : med) std::printf(" %9.2f", m);
            for (std::size_t j = 1; j < ratio.size(); ++j) std::printf(" %9.2f", ratio[j]);
            std::printf("\n");
            std::fflush(stdout);
        }
    }
    return 0;
}
