// Mixed workload: a burst of copies, then scalar work, round after round. Does a kernel's
// vector width slow down the scalar code that runs after it? On some Intel server parts a
// burst of heavy 512-bit (and to a lesser degree 256-bit) instructions lowers the core clock
// for a while (the AVX "license"), and the scalar code that follows runs at the lower clock.
// This benchmark measures exactly that, per kernel, in one interleaved run:
//   copy  : `--copies` copies of `--bytes` bytes (hot in L1/L2) with the kernel
//   scalar: a dependent chain of integer operations (no memory traffic, no vector
//           instructions), about `--scalar-us` microseconds; its time per step follows the
//           core clock
// and prints, per variant, the copy bandwidth and the scalar time per step, as the median
// over rounds of its ratio to the "none" variant (scalar work alone, no copy) of the same
// round. A scalar ratio above 1 means the copies before it slowed the scalar code down.
// Not a test; built with -DFASTCOPY_BUILD_BENCH=ON.
//
//   mixed_workload [--kernels memcpy,NAME,...] [--bytes 16K] [--copies 64] [--scalar-us 200]
//                  [--rounds 41]
// By default: memcpy and every non-streaming kernel of the registry this CPU supports.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/dispatch.h"
#include "kernels/kernels.h"
#include "kernels/registry.h"
#include "split_list.h"

using namespace fastcopy;

namespace {

using clk = std::chrono::steady_clock;

void* (*volatile g_memcpy)(void*, const void*, std::size_t) = std::memcpy;
void libc_memcpy(void* d, const void* s, std::size_t n) { g_memcpy(d, s, n); }

// A dependent chain of scalar integer steps (xorshift64): each step needs the previous one,
// so the time per step is a fixed number of core cycles.
__attribute__((noinline)) std::uint64_t scalar_work(std::uint64_t x, std::size_t steps) {
    for (std::size_t i = 0; i < steps; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        __asm__ volatile("" : "+r"(x));  // keep the compiler from vectorising or folding it
    }
    return x;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

struct Variant {
    std::string name;
    CopyFn fn;  // nullptr: no copy ("none")
};

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::string> names = {"memcpy"};
    for (const KernelEntry& e : kernel_registry()) {
        const KernelInfo* k = find_kernel(e.name);
        if (!e.streaming && k && k->supported) names.push_back(e.name);
    }
    std::size_t bytes = 16 << 10, copies = 64;
    double scalar_us = 200;
    int rounds = 41;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", a.c_str()); std::exit(2); }
            return argv[++i];
        };
        if (a == "--kernels") names = split_list(val());
        else if (a == "--bytes") bytes = parse_size(val());
        else if (a == "--copies") copies = std::strtoul(val().c_str(), nullptr, 10);
        else if (a == "--scalar-us") scalar_us = std::atof(val().c_str());
        else if (a == "--rounds") rounds = std::atoi(val().c_str());
        else { std::fprintf(stderr, "unknown option %s\n", a.c_str()); return 2; }
    }
    std::vector<Variant> vs = {{"none", nullptr}};
    for (auto& n : names) {
        if (n == "memcpy") { vs.push_back({n, libc_memcpy}); continue; }
        const KernelInfo* k = find_kernel(n);
        if (!k) { std::fprintf(stderr, "no kernel %s in this build\n", n.c_str()); return 2; }
        if (!k->supported) { std::printf("# skipping %s: %s\n", n.c_str(), k->why_not.c_str()); continue; }
        vs.push_back({n, k->fn});
    }
    std::vector<unsigned char> src(bytes + 64, 1), dst(bytes + 64, 2);

    // Calibrate the scalar steps to about scalar_us.
    std::size_t steps = 1 << 12;
    std::uint64_t sink = 88172645463325252ull;
    for (;;) {
        auto t0 = clk::now();
        sink = scalar_work(sink, steps);
        double us = std::chrono::duration<double, std::micro>(clk::now() - t0).count();
        if (us >= scalar_us || steps >= (std::size_t{1} << 32)) break;
        steps *= 2;
    }

    std::vector<std::vector<double>> copy_gbs(vs.size()), step_ns(vs.size());
    for (int r = 0; r < rounds; ++r)
        for (std::size_t k = 0; k < vs.size(); ++k) {
            const std::size_t j = (k + static_cast<std::size_t>(r)) % vs.size();
            auto t0 = clk::now();
            if (vs[j].fn)
                for (std::size_t c = 0; c < copies; ++c) vs[j].fn(dst.data(), src.data(), bytes);
            auto t1 = clk::now();
            sink = scalar_work(sink, steps);
            auto t2 = clk::now();
            const double copy_s = std::chrono::duration<double>(t1 - t0).count();
            copy_gbs[j].push_back(vs[j].fn ? double(bytes) * double(copies) / copy_s / 1e9 : 0.0);
            step_ns[j].push_back(std::chrono::duration<double, std::nano>(t2 - t1).count() / double(steps));
        }

    std::printf("mixed workload: %zu copies of %zu B, then %zu scalar steps (about %.0f us); %d interleaved rounds\n",
                copies, bytes, steps, scalar_us, rounds);
    std::printf("%-10s %12s %16s %22s\n", "variant", "copy GB/s", "scalar ns/step", "scalar vs none [q1 q3]");
    for (std::size_t j = 0; j < vs.size(); ++j) {
        std::vector<double> ratio;
        for (int r = 0; r < rounds; ++r) ratio.push_back(step_ns[j][r] / step_ns[0][r]);
        std::sort(ratio.begin(), ratio.end());
        std::printf("%-10s %12.2f %16.3f %10.3fx [%.3f %.3f]\n", vs[j].name.c_str(), median(copy_gbs[j]),
                    median(step_ns[j]), ratio[ratio.size() / 2], ratio[ratio.size() / 4], ratio[3 * ratio.size() / 4]);
    }
    return sink == 42 ? 1 : 0;  // use the result so the work is not dropped
}
