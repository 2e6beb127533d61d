// The batch engine of copy_many(), stack() and concatenate(): many independent blocks of
// rows copied in one go, spread over the thread pool when large, with an optional check
// every `step` bytes (core/strided_copy.h's StepCheck). No Python.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/strided_copy.h"

namespace fastcopy {
namespace core {

// Rows shorter than this are copied with inline fixed-size moves instead of one
// copy_bytes_piece() call each (the cut of kInlineRunBytes).
constexpr std::size_t kInlineRowBytes = static_cast<std::size_t>(kInlineRunBytes);
// Work items for the pool: a batch is cut into items of about total / (threads * 8) bytes
// (the chunking of pool::parallel_copy: 8 per thread for load balance, at most 4 MiB, its
// kMaxChunkBytes), at least 64 KiB each (evidence: copy-batch-item-size).
constexpr std::size_t kItemsPerThread = 8;
constexpr std::size_t kMinItemBytes = 64 * 1024;
constexpr std::size_t kMaxItemBytes = 4u << 20;

// `count` rows of `run` bytes: row r goes from src + r * sstride to dst + r * dstride.
struct Block {
    char* dst;
    const char* src;
    std::size_t run;
    std::size_t count;
    std::ptrdiff_t dstride;
    std::ptrdiff_t sstride;
};

// A share of the batch for one pool item: whole blocks [b0, b1), or (part == true) rows
// [r0, r1) of block b0, bytes [off, off + len) of each row.
struct Item {
    std::size_t b0, b1;
    std::size_t r0, r1;
    std::size_t off, len;
    bool part;
};

struct Batch {
    std::vector<Block> blocks;
    std::size_t total = 0;  // bytes
    std::vector<Item> items;
};

// Cuts the batch into items of about `target` bytes (replaces batch.items).
void make_items(Batch& batch, std::size_t target);
// Bytes one item copies.
std::size_t item_bytes(const Batch& batch, const Item& it);

// Copies every block; true when it ran to the end, false when `check` (may be nullptr)
// stopped it between steps (destinations then partly written). Precondition: no destination
// byte overlaps another destination byte or any source byte (pairs_interfere). Throws
// nothing; call without the GIL for large batches.
bool run_batch(Batch& batch, const StepCheck* check = nullptr) noexcept;

// A byte range of one pair: [lo, hi), a destination or a source.
struct Span {
    std::uintptr_t lo, hi;
    bool is_dst;
};
// True when a destination shares a byte with another destination or with any source (its
// own included): the pairs must then be copied one after another, in order. Sorts `spans`.
bool pairs_interfere(std::vector<Span>& spans);

}  // namespace core
}  // namespace fastcopy
