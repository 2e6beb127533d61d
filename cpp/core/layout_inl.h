// The definitions of layout.h, inline: copy()'s general path runs them on every call, and
// inlined into the bindings they cost what one function did.
#pragma once
#include <algorithm>
#include <cstring>

namespace fastcopy {
namespace core {

inline bool is_c_contiguous(const OperandDesc& op) {
    if (!op.strides || op.nbytes == 0) return true;
    std::ptrdiff_t expect = op.itemsize;
    for (int i = op.ndim - 1; i >= 0; --i) {
        if (op.shape[i] == 1) continue;
        if (op.strides[i] != expect) return false;
        expect *= op.shape[i];
    }
    return true;
}

inline void operand_extent(const OperandDesc& op, std::uintptr_t& lo, std::uintptr_t& hi) {
    std::intptr_t below = 0, above = 0;
    if (op.strides) {
        for (int i = 0; i < op.ndim; ++i) {
            const std::intptr_t span = static_cast<std::intptr_t>(op.shape[i] - 1) * op.strides[i];
            if (span < 0) below += span;
            else above += span;
        }
        above += op.itemsize;
    } else {
        above = static_cast<std::intptr_t>(op.nbytes);
    }
    const auto base = reinterpret_cast<std::uintptr_t>(op.ptr);
    lo = base + below;
    hi = base + above;
}

inline void element_layout(const OperandDesc& op, Layout& l) {
    l.ptr = op.ptr;
    l.nd = op.ndim;
    std::ptrdiff_t stride = op.itemsize;
    for (int i = op.ndim - 1; i >= 0; --i) {
        l.shape[i] = op.shape[i];
        l.strides[i] = op.strides ? op.strides[i] : stride;
        stride *= op.shape[i];
    }
}

inline void normalize_joint(Layout& d, Layout& s) {
    int nd = 0;
    for (int i = 0; i < d.nd; ++i) {
        if (d.shape[i] == 1) continue;
        d.shape[nd] = d.shape[i];
        s.shape[nd] = s.shape[i];
        d.strides[nd] = d.strides[i];
        s.strides[nd] = s.strides[i];
        ++nd;
    }
    d.nd = s.nd = nd;
    for (int i = 0; i < nd; ++i) {
        if (d.strides[i] < 0 || (d.strides[i] == 0 && s.strides[i] < 0)) {
            d.ptr += (d.shape[i] - 1) * d.strides[i];
            s.ptr += (s.shape[i] - 1) * s.strides[i];
            d.strides[i] = -d.strides[i];
            s.strides[i] = -s.strides[i];
        }
    }
    // Stable insertion sort: descending dst stride, ties by descending |src stride|.
    for (int i = 1; i < nd; ++i) {
        std::ptrdiff_t ds = d.strides[i], ss = s.strides[i], sh = d.shape[i];
        int j = i - 1;
        auto before = [&](int k) {
            if (d.strides[k] != ds) return d.strides[k] < ds;
            std::ptrdiff_t a = s.strides[k] < 0 ? -s.strides[k] : s.strides[k];
            std::ptrdiff_t b = ss < 0 ? -ss : ss;
            return a < b;
        };
        while (j >= 0 && before(j)) {
            d.strides[j + 1] = d.strides[j];
            s.strides[j + 1] = s.strides[j];
            d.shape[j + 1] = d.shape[j];
            s.shape[j + 1] = s.shape[j];
            --j;
        }
        d.strides[j + 1] = ds;
        s.strides[j + 1] = ss;
        d.shape[j + 1] = sh;
        s.shape[j + 1] = sh;
    }
    // Merge (i, i+1) when both layouts step through dim i exactly as a continuation of i+1.
    int out = 0;
    for (int i = 1; i < nd; ++i) {
        if (d.strides[out] == d.shape[i] * d.strides[i] && s.strides[out] == s.shape[i] * s.strides[i]) {
            d.shape[out] *= d.shape[i];
            s.shape[out] = d.shape[out];
            d.strides[out] = d.strides[i];
            s.strides[out] = s.strides[i];
        } else {
            ++out;
            d.shape[out] = d.shape[i];
            s.shape[out] = s.shape[i];
            d.strides[out] = d.strides[i];
            s.strides[out] = s.strides[i];
        }
    }
    d.nd = s.nd = nd ? out + 1 : 0;
}

inline void append_byte_dim_joint(Layout& d, Layout& s, std::ptrdiff_t itemsize) {
    int nd = d.nd;
    if (nd > 0 && d.strides[nd - 1] == itemsize && s.strides[nd - 1] == itemsize) {
        d.shape[nd - 1] *= itemsize;
        s.shape[nd - 1] = d.shape[nd - 1];
        d.strides[nd - 1] = s.strides[nd - 1] = 1;
        return;
    }
    d.shape[nd] = s.shape[nd] = itemsize;
    d.strides[nd] = s.strides[nd] = 1;
    d.nd = s.nd = nd + 1;
}

inline void to_byte_runs(Layout& l, std::ptrdiff_t itemsize) {
    Layout t;
    t.ptr = l.ptr;
    int nd = 0;
    for (int i = 0; i < l.nd; ++i) {
        if (l.shape[i] == 1) continue;
        t.shape[nd] = l.shape[i];
        t.strides[nd] = l.strides[i];
        ++nd;
    }
    t.shape[nd] = itemsize;
    t.strides[nd] = 1;
    ++nd;
    // Merge from the inside out.
    int out = nd - 1;
    l.ptr = t.ptr;
    std::ptrdiff_t shape[kMaxDims], strides[kMaxDims];
    shape[out] = t.shape[nd - 1];
    strides[out] = t.strides[nd - 1];
    for (int i = nd - 2; i >= 0; --i) {
        if (t.strides[i] == shape[out] * strides[out]) {
            shape[out] *= t.shape[i];
        } else {
            --out;
            shape[out] = t.shape[i];
            strides[out] = t.strides[i];
        }
    }
    l.nd = nd - out;
    for (int i = 0; i < l.nd; ++i) {
        l.shape[i] = shape[out + i];
        l.strides[i] = strides[out + i];
    }
}

inline void reshape_contiguous_like(Layout& c, const Layout& o) {
    c.nd = o.nd;
    std::ptrdiff_t stride = 1;
    for (int i = o.nd - 1; i >= 0; --i) {
        c.shape[i] = o.shape[i];
        c.strides[i] = stride;
        stride *= o.shape[i];
    }
}

inline bool plan_pair(const OperandDesc& d, const OperandDesc& s, Layout& dl, Layout& sl) {
    element_layout(d, dl);
    element_layout(s, sl);
    const bool same_shape =
        d.ndim == s.ndim &&
        (d.ndim == 0 || std::memcmp(d.shape, s.shape, sizeof(std::ptrdiff_t) * static_cast<std::size_t>(d.ndim)) == 0);
    if (same_shape && d.itemsize == s.itemsize) {
        normalize_joint(dl, sl);
        append_byte_dim_joint(dl, sl, d.itemsize);
        return true;
    }
    to_byte_runs(dl, d.itemsize);
    to_byte_runs(sl, s.itemsize);
    if (dl.nd == 1) reshape_contiguous_like(dl, sl);
    else if (sl.nd == 1) reshape_contiguous_like(sl, dl);
    else return false;
    return true;
}

inline RunIter::RunIter(const Layout& layout) : l(&layout) {
    std::fill(idx, idx + l->nd, 0);
    run = l->ptr;
    run_len = l->shape[l->nd - 1];
    left = run_len;
}

inline void RunIter::next() {
    for (int i = l->nd - 2; i >= 0; --i) {
        run += l->strides[i];
        if (++idx[i] < l->shape[i]) break;
        run -= l->strides[i] * l->shape[i];
        idx[i] = 0;
    }
    left = run_len;
}

}  // namespace core
}  // namespace fastcopy
