// The batch engine (batch.h).
#include "core/batch.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "core/dispatch.h"
#include "pool/pool.h"

namespace fastcopy {
namespace core {

namespace {

template <std::size_t K>
void small_rows(char* d, const char* s, std::size_t rows, std::ptrdiff_t ds, std::ptrdiff_t ss) {
    for (std::size_t r = 0; r < rows; ++r, d += ds, s += ss) std::memcpy(d, s, K);
}

// Rows [r0, r1) of b, bytes [off, off + len) of each. `whole`: bytes in the batch, for the
// non-temporal decision (the batch's destination is that large).
void copy_rows(const Block& b, std::size_t r0, std::size_t r1, std::size_t off, std::size_t len,
               std::size_t whole) {
    char* d = b.dst + static_cast<std::ptrdiff_t>(r0) * b.dstride + off;
    const char* s = b.src + static_cast<std::ptrdiff_t>(r0) * b.sstride + off;
    const std::size_t rows = r1 - r0;
    if (len == 0 || rows == 0) return;
    if (rows > 1 && static_cast<std::ptrdiff_t>(len) == b.dstride && b.dstride == b.sstride) {
        copy_bytes_piece(d, s, len * rows, whole, Region::Private);  // rows are contiguous
        return;
    }
    if (len >= kInlineRowBytes) {
        for (std::size_t r = 0; r < rows; ++r, d += b.dstride, s += b.sstride)
            copy_bytes_piece(d, s, len, whole, Region::Private);
        return;
    }
    switch (len) {
        case 1: small_rows<1>(d, s, rows, b.dstride, b.sstride); break;
        case 2: small_rows<2>(d, s, rows, b.dstride, b.sstride); break;
        case 4: small_rows<4>(d, s, rows, b.dstride, b.sstride); break;
        case 8: small_rows<8>(d, s, rows, b.dstride, b.sstride); break;
        case 16: small_rows<16>(d, s, rows, b.dstride, b.sstride); break;
        default:
            for (std::size_t r = 0; r < rows; ++r, d += b.dstride, s += b.sstride) std::memcpy(d, s, len);
    }
}

void run_one(const Batch& batch, std::size_t i) {
    const Item& it = batch.items[i];
    if (it.part) {
        copy_rows(batch.blocks[it.b0], it.r0, it.r1, it.off, it.len, batch.total);
        return;
    }
    for (std::size_t b = it.b0; b < it.b1; ++b) {
        const Block& bl = batch.blocks[b];
        copy_rows(bl, 0, bl.count, 0, bl.run, batch.total);
    }
}

// Items [first, first + n) of a batch, for pool::parallel_for.
struct Window {
    const Batch* batch;
    std::size_t first;
};

void run_window_item(void* ctx, std::size_t i) {
    const Window& w = *static_cast<const Window*>(ctx);
    run_one(*w.batch, w.first + i);
}

}  // namespace

std::size_t item_bytes(const Batch& batch, const Item& it) {
    if (it.part) return (it.r1 - it.r0) * it.len;
    std::size_t n = 0;
    for (std::size_t b = it.b0; b < it.b1; ++b) n += batch.blocks[b].run * batch.blocks[b].count;
    return n;
}

void make_items(Batch& batch, std::size_t target) {
    batch.items.clear();
    std::size_t group_start = 0, group_bytes = 0;
    auto close_group = [&](std::size_t end) {
        if (end > group_start) batch.items.push_back({group_start, end, 0, 0, 0, 0, false});
        group_start = end;
        group_bytes = 0;
    };
    for (std::size_t b = 0; b < batch.blocks.size(); ++b) {
        const Block& bl = batch.blocks[b];
        const std::size_t bytes = bl.run * bl.count;
        if (bytes < target) {
            group_bytes += bytes;
            if (group_bytes >= target) close_group(b + 1);
            continue;
        }
        close_group(b);
        if (bl.run >= target) {  // each row in pieces of ~target bytes (64-byte multiples)
            const std::size_t pieces = (bl.run + target - 1) / target;
            std::size_t piece = (bl.run + pieces - 1) / pieces;
            piece = (piece + 63) & ~std::size_t(63);
            for (std::size_t r = 0; r < bl.count; ++r)
                for (std::size_t off = 0; off < bl.run; off += piece)
                    batch.items.push_back({b, b + 1, r, r + 1, off, std::min(piece, bl.run - off), true});
        } else {  // groups of rows
            const std::size_t rows = std::max<std::size_t>(1, target / bl.run);
            for (std::size_t r = 0; r < bl.count; r += rows)
                batch.items.push_back({b, b + 1, r, std::min(r + rows, bl.count), 0, bl.run, true});
        }
        group_start = b + 1;
    }
    close_group(batch.blocks.size());
}

bool run_batch(Batch& batch, const StepCheck* check) noexcept {
    const unsigned threads = pool::threads();
    const bool parallel = threads > 1 && batch.total >= parallel_threshold();
    const bool stepped = check && check->stop && check->step > 0 && batch.total > check->step;
    Progress pr(stepped ? check : nullptr, batch.total);
    bool itemized = false;
    if (parallel || stepped) {
        std::size_t target = kMaxItemBytes;
        if (parallel) {
            target = batch.total / (std::size_t(threads) * kItemsPerThread);
            target = std::min(std::max(target, kMinItemBytes), kMaxItemBytes);
        }
        if (stepped) target = std::min(target, check->step);  // items no larger than a step
        try {
            make_items(batch, target);
            itemized = true;
        } catch (const std::bad_alloc&) {
            batch.items.clear();  // no room for the items: copy block by block on this thread
        }
    }
    if (!itemized) {
        for (const Block& bl : batch.blocks) {
            copy_rows(bl, 0, bl.count, 0, bl.run, batch.total);
            if (pr.add(bl.run * bl.count)) return false;
        }
        return true;
    }
    // Windows of items of at least one step each (the whole batch without a check); the
    // check runs between windows.
    const std::size_t n = batch.items.size();
    for (std::size_t i = 0; i < n;) {
        std::size_t j = i, bytes = 0;
        if (stepped) {
            while (j < n && bytes < check->step) bytes += item_bytes(batch, batch.items[j++]);
        } else {
            j = n;
            bytes = batch.total;
        }
        if (parallel) {
            Window w{&batch, i};
            pool::parallel_for(j - i, run_window_item, &w);
        } else {
            for (std::size_t k = i; k < j; ++k) run_one(batch, k);
        }
        i = j;
        if (pr.add(bytes)) return false;
    }
    return true;
}

bool pairs_interfere(std::vector<Span>& spans) {
    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.lo < b.lo; });
    std::uintptr_t max_hi_any = 0, max_hi_dst = 0;
    for (const Span& s : spans) {
        if (s.is_dst ? s.lo < max_hi_any : s.lo < max_hi_dst) return true;
        max_hi_any = std::max(max_hi_any, s.hi);
        if (s.is_dst) max_hi_dst = std::max(max_hi_dst, s.hi);
    }
    return false;
}

}  // namespace core
}  // namespace fastcopy
