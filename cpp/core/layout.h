// The layout algebra of copy(): strided byte layouts, their normalization into contiguous
// runs, extents and overlap. No Python: an operand is described by an OperandDesc (what a
// numpy array or a Py_buffer says about its memory), filled by the bindings.
#pragma once
#include <cstddef>
#include <cstdint>

namespace fastcopy {
namespace core {

// Dimensions of a layout: numpy's maximum (64) plus the byte dimension appended to it.
constexpr int kMaxOperandDims = 64;
constexpr int kMaxDims = kMaxOperandDims + 2;

// One operand's memory: `ndim` dimensions of `shape`, `strides` in bytes (nullptr means
// C-contiguous), items of `itemsize` bytes starting at `ptr`. Views `shape`/`strides` are
// owned by whoever filled the description (the array or the buffer export).
struct OperandDesc {
    char* ptr = nullptr;
    std::ptrdiff_t itemsize = 1;
    int ndim = 0;
    const std::ptrdiff_t* shape = nullptr;
    const std::ptrdiff_t* strides = nullptr;
    std::size_t nbytes = 0;
    bool readonly = false;
};

// True when the C-order traversal of `op` is one contiguous run of nbytes (size-1 dimensions
// may have any stride; an empty operand is contiguous).
bool is_c_contiguous(const OperandDesc& op);

// A strided byte layout: C-order traversal of `shape` gives the logical byte sequence.
struct Layout {
    char* ptr = nullptr;
    int nd = 0;
    std::ptrdiff_t shape[kMaxDims];
    std::ptrdiff_t strides[kMaxDims];
};

// Lowest and one-past-highest byte an operand touches (nonempty operands only).
void operand_extent(const OperandDesc& op, std::uintptr_t& lo, std::uintptr_t& hi);

// The element layout of `op` (no byte dimension yet).
void element_layout(const OperandDesc& op, Layout& l);

// For two layouts of the same shape: drops size-1 dimensions, flips dimensions where dst
// runs backwards, orders dimensions by dst stride (largest outermost) and merges adjacent
// dimensions that are contiguous in both. Every step applies the same change to both
// layouts, so element i of dst still pairs with element i of src (np.copyto's pairing).
void normalize_joint(Layout& d, Layout& s);

// For layouts normalized together: appends the byte dimension to both and merges it with
// the last element dimension when both are contiguous there. The shapes stay identical.
void append_byte_dim_joint(Layout& d, Layout& s, std::ptrdiff_t itemsize);

// Appends the byte dimension (itemsize bytes, stride 1) and merges dimensions that are
// contiguous continuations of the next one. The C-order byte sequence is unchanged; the
// innermost dimension is then always a contiguous run of shape[nd-1] bytes.
void to_byte_runs(Layout& l, std::ptrdiff_t itemsize);

// Gives a contiguous byte layout `c` the shape of byte layout `o` (C order, same bytes).
void reshape_contiguous_like(Layout& c, const Layout& o);

// Lowest and one-past-highest byte a byte layout touches (nonempty layouts only).
inline void extent(const Layout& l, std::uintptr_t& lo, std::uintptr_t& hi) {
    std::intptr_t a = 0, b = 0;
    for (int i = 0; i < l.nd; ++i) {
        std::intptr_t span = static_cast<std::intptr_t>(l.shape[i] - 1) * l.strides[i];
        if (span < 0) a += span;
        else b += span;
    }
    lo = reinterpret_cast<std::uintptr_t>(l.ptr) + a;
    hi = reinterpret_cast<std::uintptr_t>(l.ptr) + b + 1;
}

// True when the extents of two nonempty byte layouts share a byte.
inline bool extents_overlap(const Layout& a, const Layout& b) {
    std::uintptr_t alo, ahi, blo, bhi;
    extent(a, alo, ahi);
    extent(b, blo, bhi);
    return alo < bhi && blo < ahi;
}

// True when [d, d+n) and [s, s+n) share a byte.
inline bool runs_overlap(const void* d, const void* s, std::size_t n) {
    std::uintptr_t a = reinterpret_cast<std::uintptr_t>(d), b = reinterpret_cast<std::uintptr_t>(s);
    return (a > b ? a - b : b - a) < n;
}

// The byte layouts of a checked pair (equal byte counts, nonempty). Same shape and itemsize:
// element i of dst pairs with element i of src (normalize_joint). Otherwise the C-order byte
// sequences pair up; when one side is contiguous it takes the other's shape. Returns true
// when the two layouts end with identical shapes (walked together by copy_joint), false when
// their runs must be paired one by one (copy_runs).
bool plan_pair(const OperandDesc& d, const OperandDesc& s, Layout& dl, Layout& sl);

// Walks the contiguous runs (innermost dimension, stride 1) of a byte layout in C order.
struct RunIter {
    const Layout* l;
    std::ptrdiff_t idx[kMaxDims];
    char* run;                // start of the current run
    std::ptrdiff_t run_len;   // bytes in a run
    std::ptrdiff_t left;      // bytes left in the current run

    explicit RunIter(const Layout& layout);
    char* pos() const { return run + (run_len - left); }
    // Moves to the next run (call when left == 0 and more bytes remain).
    void next();
};

}  // namespace core
}  // namespace fastcopy

#include "core/layout_inl.h"
