// Building blocks of the copy kernels, written once over a vector trait V (vec_*.h):
//   V::type, V::kWidth (W bytes), V::Half (the trait one step down the size ladder),
//   V::load / V::store (unaligned), V::store_aligned (W-aligned address),
//   V::kBackwardBelowPageDistance (disjoint copies at a page distance in 1 .. this - 1 run the
//   backward loop; 0: never), V::kSmallMaxVectors (4 or 8: the largest copy of overlapping
//   head and tail moves, in vectors; larger ones run the loop), V::kSplitSmallCopiesAtPages
//   (disjoint copies of up to 8 vectors whose destination crosses a 4 KiB page boundary are
//   made in two parts meeting there: split_at_page), and for the streaming blocks
//   V::stream (non-temporal, 64-byte aligned) and V::fence.
// A kernel file instantiates them for its trait (x86_avx2.cpp: vec::Avx2, x86_avx512.cpp:
// vec::Avx512, arm_neon.cpp: vec::Neon); cpp/tests instantiates them for a test-only 64-byte
// trait so the AVX-512 logic runs on CPUs without AVX-512.
//
// Include protocol: the including file defines FASTCOPY_OPS_TARGET (the target attribute its
// trait needs, or nothing) and includes ops.h once, after every other header. Every block
// is always_inline and lives in an unnamed namespace: each kernel file gets its own copy,
// compiled for its own instruction set, and no copy can be shared with (or picked by the
// linker for) a file compiled for another one.
//
// Shape of a cached (memmove) kernel, in blocks (S = V::kSmallMaxVectors):
//   n <= 8W, disjoint, the destination crossing a page (traits that ask: split_at_page):
//                 the part before the boundary, then the part from it, each as below.
//   n <= S*W      small(): size classes, each two groups of overlapping moves (head and
//                 tail); every load happens before any store, so any overlap in either
//                 direction is correct. Below W the ladder steps down through V::Half.
//   S*W < n <= 8W (S = 4 only) four_to_eight_vectors(): the 4 + 4 head and tail moves where
//                 the destination is W-aligned, else one pass of the forward loop below
//                 (all loads before the stores: any overlap).
//   n >  8W       head and tail kept in registers, then a loop of 4 loads + 4 aligned stores
//                 runs forward (dst <= src or disjoint) or backward (dst inside (src,
//                 src+n), or disjoint at a short page distance where the trait asks for
//                 it: copies_backward_at_distance); the saved head/tail are stored last.
//                 Every store writes the original source byte of its position, so the
//                 result equals memmove's.
// The streaming kernel adds a forward loop of non-temporal 64-byte lines for large
// disjoint copies. No block reads or writes a byte outside [src, src+n) / [dst, dst+n).
#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#ifndef FASTCOPY_OPS_TARGET
#error "define FASTCOPY_OPS_TARGET (the kernel's target attribute, may be empty) before including ops.h"
#endif

#define FASTCOPY_OP FASTCOPY_OPS_TARGET __attribute__((always_inline)) inline

namespace fastcopy {
namespace ops {
namespace {

using u8 = unsigned char;
using std::size_t;

// K vectors from the front and K from the back of [0, n), n in [K*W, 2*K*W]: all 2K loads,
// then all 2K stores (overlap-safe). The index sequence unrolls it at compile time.
template <class V, size_t... I>
FASTCOPY_OP void head_tail_k(u8* d, const u8* s, size_t n, std::index_sequence<I...>) {
    constexpr size_t W = V::kWidth, K = sizeof...(I);
    const typename V::type head[K] = {V::load(s + I * W)...};
    const typename V::type tail[K] = {V::load(s + n - (K - I) * W)...};
    (V::store(d + I * W, head[I]), ...);
    (V::store(d + n - (K - I) * W, tail[I]), ...);
}
template <class V, size_t K>
FASTCOPY_OP void head_tail(u8* d, const u8* s, size_t n) {
    head_tail_k<V>(d, s, n, std::make_index_sequence<K>{});
}

// 0 <= n <= V::kWidth: steps down the ladder (W, W/2, ... 1 byte); n in (W/2, W] is two
// overlapping moves of W/2 bytes.
template <class V>
FASTCOPY_OP void up_to_width(u8* d, const u8* s, size_t n) {
    if constexpr (std::is_void<typename V::Half>::value) {
        if (n == 1) *d = *s;  // V is the 1-byte word
    } else {
        using H = typename V::Half;
        if (n <= H::kWidth) {
            up_to_width<H>(d, s, n);
            return;
        }
        head_tail<H, 1>(d, s, n);
    }
}

// 0 <= n <= V::kSmallMaxVectors * W, any overlap. The classes are tested smallest first
// (GCC 12 lays the last class out as the fall-through).
template <class V>
FASTCOPY_OP void small(u8* d, const u8* s, size_t n) {
    constexpr size_t W = V::kWidth;
    using H = typename V::Half;
    if (n <= H::kWidth) {
        up_to_width<H>(d, s, n);
        return;
    }
    if (n <= W) {
        head_tail<H, 1>(d, s, n);
        return;
    }
    if (n <= 2 * W) {
        head_tail<V, 1>(d, s, n);
        return;
    }
    if constexpr (V::kSmallMaxVectors == 8) {
        if (n <= 4 * W) {
            head_tail<V, 2>(d, s, n);
            return;
        }
        head_tail<V, 4>(d, s, n);
    } else {
        static_assert(V::kSmallMaxVectors == 4, "small() ends at 4 or 8 vectors");
        head_tail<V, 2>(d, s, n);
    }
}

template <class V, size_t... I>
FASTCOPY_OP void loop_body(u8* d, const u8* s, std::index_sequence<I...>) {
    constexpr size_t W = V::kWidth;
    const typename V::type v[sizeof...(I)] = {V::load(s + I * W)...};
    (V::store_aligned(d + I * W, v[I]), ...);
}
template <class V, size_t... I>
FASTCOPY_OP void loop_body_reversed(u8* d, const u8* s, std::index_sequence<I...>) {
    constexpr size_t W = V::kWidth, K = sizeof...(I);
    const typename V::type v[K] = {V::load(s + I * W)...};
    (V::store_aligned(d + (K - 1 - I) * W, v[K - 1 - I]), ...);  // highest address first
}

// n > 4W; dst <= src or disjoint (or n <= 8W: one pass at most, all loads before the
// stores, any overlap). Forward 4 x W loop with W-aligned stores.
template <class V>
FASTCOPY_OP void loop_and_tail_forward(u8* d, const u8* s, size_t n) {
    constexpr size_t W = V::kWidth;
    const typename V::type head = V::load(s);
    const typename V::type t0 = V::load(s + n - 4 * W), t1 = V::load(s + n - 3 * W),
                           t2 = V::load(s + n - 2 * W), t3 = V::load(s + n - W);
    size_t i = (0u - reinterpret_cast<std::uintptr_t>(d)) & (W - 1);  // d + i is W-aligned
    for (; n - i > 4 * W; i += 4 * W) loop_body<V>(d + i, s + i, std::make_index_sequence<4>{});
    V::store(d + n - 4 * W, t0);
    V::store(d + n - 3 * W, t1);
    V::store(d + n - 2 * W, t2);
    V::store(d + n - W, t3);
    V::store(d, head);
}

// n > 8W; dst >= src or disjoint. Backward 4 x W loop with W-aligned stores.
template <class V>
FASTCOPY_OP void loop_and_head_backward(u8* d, const u8* s, size_t n) {
    constexpr size_t W = V::kWidth;
    const typename V::type tail = V::load(s + n - W);
    const typename V::type h0 = V::load(s), h1 = V::load(s + W), h2 = V::load(s + 2 * W), h3 = V::load(s + 3 * W);
    size_t i = n - (reinterpret_cast<std::uintptr_t>(d + n) & (W - 1));  // d + i is W-aligned
    while (i > 4 * W) {
        i -= 4 * W;
        loop_body_reversed<V>(d + i, s + i, std::make_index_sequence<4>{});
    }
    V::store(d, h0);
    V::store(d + W, h1);
    V::store(d + 2 * W, h2);
    V::store(d + 3 * W, h3);
    V::store(d + n - W, tail);
}

// A disjoint copy of more than 8W bytes at page distance (dst - src) mod 4096 = distance runs
// the backward loop when 0 < distance < V::kBackwardBelowPageDistance. Going forward there,
// each loop's loads sit at the same offsets within their 4 KiB page as the stores just made
// (4K aliasing), and the forward loop collapses at some buffer placements where the backward
// one does not; glibc's x86_64 memmove copies backward at these distances for the same reason
// (evidence: kernels-backward-short-distance). Page-aligned copies (distance 0) alias nothing
// and stay forward.
template <class V>
FASTCOPY_OP bool copies_backward_at_distance(std::uintptr_t distance) {
    return distance != 0 && distance < V::kBackwardBelowPageDistance;
}

// 4W < n <= 8W, any overlap, for traits whose small() ends at 4 vectors. A W-aligned
// destination takes the 4 + 4 head and tail moves (their head stores are then aligned); any
// other takes loop_and_tail_forward, whose stores in the middle are aligned. At these sizes
// that loop makes at most one pass, so all its loads come before its stores and it is correct
// for overlaps in either direction, at every page distance (on the Intel CPU measured it ran
// faster than the backward loop at distance 16; evidence: kernels-avx512-loop-from-256).
template <class V>
FASTCOPY_OP void four_to_eight_vectors(u8* d, const u8* s, size_t n) {
    if ((reinterpret_cast<std::uintptr_t>(d) & (V::kWidth - 1)) == 0) head_tail<V, 4>(d, s, n);
    else loop_and_tail_forward<V>(d, s, n);
}

// n <= 8W, any overlap: small() or four_to_eight_vectors().
template <class V>
FASTCOPY_OP void up_to_eight_vectors(u8* d, const u8* s, size_t n) {
    if constexpr (V::kSmallMaxVectors == 8) {
        small<V>(d, s, n);
    } else {
        if (n <= V::kSmallMaxVectors * V::kWidth) small<V>(d, s, n);
        else four_to_eight_vectors<V>(d, s, n);
    }
}
// A disjoint copy of n <= 8W bytes whose destination crosses a 4 KiB page boundary `before`
// bytes in: the bytes before the boundary, then those from it, each with moves inside its own
// part, so that no store straddles the boundary. Out of line and cold: the check that leads
// here costs the common copy a compare, not the code of two more copies.
template <class V>
FASTCOPY_OPS_TARGET __attribute__((noinline, cold)) void copy_split_at_page(u8* d, const u8* s, size_t n,
                                                                            size_t before) {
    up_to_eight_vectors<V>(d, s, before);
    up_to_eight_vectors<V>(d + before, s + before, n - before);
}
// n <= 8W. Where [d, d+n) crosses a 4 KiB page boundary and the ranges are disjoint, copies it
// with copy_split_at_page(); returns false (nothing copied) otherwise. Overlapping copies stay
// whole: their moves load everything before storing anything, which two parts would not.
template <class V>
FASTCOPY_OP bool split_at_page(u8* d, const u8* s, size_t n) {
    const size_t before = 4096 - (reinterpret_cast<std::uintptr_t>(d) & 4095);
    if (__builtin_expect(before >= n, 1)) return false;
    const std::uintptr_t diff = reinterpret_cast<std::uintptr_t>(d) - reinterpret_cast<std::uintptr_t>(s);
    if (diff < n || 0u - diff < n) return false;
    copy_split_at_page<V>(d, s, n, before);
    return true;
}
// The cached kernel: memmove semantics for any n and any overlap.
template <class V>
FASTCOPY_OP void memmove_cached(void* dst, const void* src, size_t n) {
    auto* d = static_cast<u8*>(dst);
    auto* s = static_cast<const u8*>(src);
    if (n <= 8 * V::kWidth) {
        if constexpr (V::kSplitSmallCopiesAtPages) {
            if (split_at_page<V>(d, s, n)) return;
        }
        up_to_eight_vectors<V>(d, s, n);
        return;
    }
    const std::uintptr_t diff = reinterpret_cast<std::uintptr_t>(d) - reinterpret_cast<std::uintptr_t>(s);
    if (diff == 0) return;
    // dst inside (src, src+n): backward is required; src inside (dst, dst+n): forward is.
    // Disjoint copies go forward, except at the page distances the trait names
    // (copies_backward_at_distance).
    const bool disjoint = diff >= n && 0u - diff >= n;
    if (diff < n || (disjoint && copies_backward_at_distance<V>(diff & 4095))) loop_and_head_backward<V>(d, s, n);
    else loop_and_tail_forward<V>(d, s, n);
}

// ---- streaming (non-temporal) blocks -------------------------------------------------
constexpr size_t kLine = 64;  // cache line: the unit of a non-temporal store

// Lines from several places: vector I is vector I % L of line I / L, found at
// s + (I / L) * kStride (L = vectors per 64-byte line). All are loaded, then streamed in the
// same order.
template <class V, size_t kStride, size_t... I>
FASTCOPY_OP void stream_lines(u8* d, const u8* s, std::index_sequence<I...>) {
    constexpr size_t W = V::kWidth, L = kLine / W;
    static_assert(kLine % W == 0, "a vector must divide the cache line");
    const typename V::type v[sizeof...(I)] = {V::load(s + (I / L) * kStride + (I % L) * W)...};
    (V::stream(d + (I / L) * kStride + (I % L) * W, v[I]), ...);
}

// One 64-byte line with ordinary (cached, unaligned) stores.
template <class V, size_t... I>
FASTCOPY_OP void plain_line(u8* d, const u8* s, std::index_sequence<I...>) {
    constexpr size_t W = V::kWidth;
    const typename V::type v[sizeof...(I)] = {V::load(s + I * W)...};
    (V::store(d + I * W, v[I]), ...);
}

// Non-temporal forward copy for non-overlapping ranges, n >= 2 lines: 64-byte-aligned
// streaming stores of whole cache lines; the unaligned head and tail line use ordinary
// stores. Because the ranges do not overlap, overlapping ordinary and streaming stores write
// identical bytes, so their order does not matter; one fence at the end orders the streams.
// The bulk goes in blocks of 4 x 4 KiB, taking one cache line from each of the 4 pages in
// turn: 4 concurrent streams per direction keep the memory controller busier than one
// (evidence: kernels-stream-four-pages).
template <class V>
FASTCOPY_OP void stream_forward(u8* d, const u8* s, size_t n) {
    constexpr size_t L = kLine / V::kWidth;  // vectors per line
    constexpr size_t kPage = 4096, kBlock = 4 * kPage;
    plain_line<V>(d, s, std::make_index_sequence<L>{});  // head line
    size_t i = (0u - reinterpret_cast<std::uintptr_t>(d)) & (kLine - 1);  // d + i 64-aligned
    for (; n - i >= kBlock; i += kBlock)
        for (size_t j = 0; j < kPage; j += kLine)
            stream_lines<V, kPage>(d + i + j, s + i + j, std::make_index_sequence<4 * L>{});
    for (; n - i >= 2 * kLine; i += 2 * kLine)
        stream_lines<V, kLine>(d + i, s + i, std::make_index_sequence<2 * L>{});
    if (n - i >= kLine) stream_lines<V, kLine>(d + i, s + i, std::make_index_sequence<L>{});
    plain_line<V>(d + n - kLine, s + n - kLine, std::make_index_sequence<L>{});  // tail line
    V::fence();
}

// Below this size streaming stores are a loss (a single cache line's round trip to memory).
constexpr size_t kStreamMinBytes = 1024;

// The streaming kernel: memmove semantics; small and overlapping copies (either direction)
// go to `cached`, the file's cached kernel (memmove_cached<V>). A call, not the inlined
// blocks: it compiles to a tail jump taken before the streaming loop's prologue, which keeps
// small copies as fast as through the cached kernel itself (inlined, the blocks save the
// streaming loop's registers on every call; evidence: kernels-streaming-tail-call).
template <class V, void (*cached)(void*, const void*, size_t)>
FASTCOPY_OP void memmove_streaming(void* dst, const void* src, size_t n) {
    const std::uintptr_t diff = reinterpret_cast<std::uintptr_t>(dst) - reinterpret_cast<std::uintptr_t>(src);
    // Laid out as the fall-through path: one streamed copy of >= 1 KiB never notices the
    // taken branch, a 64 B copy through the fallback would (evidence: kernels-streaming-tail-call).
    if (__builtin_expect(n < kStreamMinBytes || diff < n || 0u - diff < n, 1)) {
        cached(dst, src, n);
        return;
    }
    stream_forward<V>(static_cast<u8*>(dst), static_cast<const u8*>(src), n);
}

}  // namespace
}  // namespace ops
}  // namespace fastcopy

#undef FASTCOPY_OP
