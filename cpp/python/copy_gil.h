// When copy() and the numpy drop-ins (bindings.cpp, bindings_batch.cpp) release the GIL.
#pragma once
#include <cstddef>

namespace fastcopy {

// Copies (and batches) of at least this many bytes release the GIL. Measured on the 2-vCPU
// x86_64 dev machine with `benchmarks/call_overhead.py --gil` (contiguous uint8, medians): a
// copy costs ~30 ns at 1 KiB, ~120 ns at 16 KiB, ~700 ns at 32 KiB, ~1.4-1.6 us at 64 KiB; the
// step t(64 KiB) - t(64 KiB - 1), i.e. one uncontended release + re-acquire, measured 4-100 ns
// (noisy shared machine; ~100 ns is the usual figure). At 64 KiB the release is <= ~6% of the
// call; at 16 KiB it could be most of it, and under contention re-acquiring can wait for
// another thread's switch interval, so small copies keep the GIL.
constexpr std::size_t kCopyReleaseGilBytes = 64 * 1024;

}  // namespace fastcopy
