// Copying between two byte layouts (strided_copy.h).
#include "core/strided_copy.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "pool/pool.h"

namespace fastcopy {
namespace core {

void CopyCtx::operator()(void* d, const void* s, std::size_t n) const {
    if (!forced && shared) copy_bytes_to_shared(d, s, n, shared);
    else if (!forced) copy_bytes(d, s, n, region);
    else if (forced_threads > 1 && !runs_overlap(d, s, n)) pool::parallel_copy_threads(d, s, n, forced, forced_threads);
    else copy_bytes_with(forced, d, s, n);
}

namespace {

// Copies the byte sequence of s into the byte sequence of d (equal lengths `total`).
// A Progress that never checks: the unchecked copies compile to plain loops.
struct NoProgress {
    NoProgress(const StepCheck*, std::size_t) {}
    static constexpr bool add(std::size_t) { return false; }
    static constexpr bool stopped() { return false; }
    static constexpr std::size_t items_per_step(std::size_t) { return SIZE_MAX; }
};

template <class P>
void copy_runs(const Layout& d, const Layout& s, std::size_t total, const CopyCtx& cp, P& pr) {
    RunIter di(d), si(s);
    std::size_t done = 0;
    if (di.run_len == si.run_len) {  // common case: runs pair up one to one
        std::size_t n = static_cast<std::size_t>(di.run_len);
        for (;;) {
            cp(di.run, si.run, n);
            done += n;
            if (done >= total || pr.add(n)) return;
            di.next();
            si.next();
        }
    }
    for (;;) {
        std::ptrdiff_t n = std::min(di.left, si.left);
        cp(di.pos(), si.pos(), static_cast<std::size_t>(n));
        done += static_cast<std::size_t>(n);
        if (done >= total || pr.add(static_cast<std::size_t>(n))) return;
        di.left -= n;
        si.left -= n;
        if (di.left == 0) di.next();
        if (si.left == 0) si.next();
    }
}

// Calls f(dp, sp) for every index of dimensions [0, nouter) of two same-shaped layouts, until
// f returns true.
template <class F>
void for_each_outer(const Layout& d, const Layout& s, int nouter, F&& f) {
    char* dp = d.ptr;
    char* sp = s.ptr;
    if (nouter <= 0) {
        f(dp, sp);
        return;
    }
    std::ptrdiff_t idx[kMaxDims];
    std::fill(idx, idx + nouter, 0);
    for (;;) {
        if (f(dp, sp)) return;
        int i = nouter - 1;
        for (; i >= 0; --i) {
            dp += d.strides[i];
            sp += s.strides[i];
            if (++idx[i] < d.shape[i]) break;
            dp -= d.strides[i] * d.shape[i];
            sp -= s.strides[i] * s.shape[i];
            idx[i] = 0;
        }
        if (i < 0) return;
    }
}

template <std::size_t K>
void small_loop(char* dp, const char* sp, std::ptrdiff_t count, std::ptrdiff_t dstep, std::ptrdiff_t sstep) {
    for (std::ptrdiff_t i = 0; i < count; ++i, dp += dstep, sp += sstep) std::memcpy(dp, sp, K);
}

// Copies between two same-shaped byte layouts whose innermost dimension is a contiguous
// run (stride 1) in both. Precondition: no overlap unless both are one contiguous run.
template <class P>
void copy_joint(const Layout& d, const Layout& s, const CopyCtx& cp, P& pr) {
    int nd = d.nd;
    std::ptrdiff_t run = d.shape[nd - 1];
    if (nd == 1) {
        cp(d.ptr, s.ptr, static_cast<std::size_t>(run));
        pr.add(static_cast<std::size_t>(run));
        return;
    }
    if (run >= kInlineRunBytes || cp.forced) {
        for_each_outer(d, s, nd - 1, [&](char* dp, char* sp) {
            cp(dp, sp, static_cast<std::size_t>(run));
            return pr.add(static_cast<std::size_t>(run));
        });
        return;
    }
    const std::ptrdiff_t count = d.shape[nd - 2], dstep = d.strides[nd - 2], sstep = s.strides[nd - 2];
    // Rows of `count` elements of `run` bytes, cut into chunks of one step each when checked.
    auto rows = [run, dstep, sstep](char* dp, const char* sp, std::ptrdiff_t k) {
        switch (run) {
            case 1: small_loop<1>(dp, sp, k, dstep, sstep); break;
            case 2: small_loop<2>(dp, sp, k, dstep, sstep); break;
            case 4: small_loop<4>(dp, sp, k, dstep, sstep); break;
            case 8: small_loop<8>(dp, sp, k, dstep, sstep); break;
            case 16: small_loop<16>(dp, sp, k, dstep, sstep); break;
            default:
                for (std::ptrdiff_t i = 0; i < k; ++i, dp += dstep, sp += sstep)
                    std::memcpy(dp, sp, static_cast<std::size_t>(run));
        }
    };
    if constexpr (std::is_same_v<P, NoProgress>) {
        for_each_outer(d, s, nd - 2, [&](char* dp, char* sp) {
            rows(dp, sp, count);
            return false;
        });
    } else {
        const std::size_t per_step = pr.items_per_step(static_cast<std::size_t>(run));
        const std::ptrdiff_t chunk =
            per_step >= static_cast<std::size_t>(count) ? count : static_cast<std::ptrdiff_t>(per_step);
        for_each_outer(d, s, nd - 2, [&](char* dp, char* sp) {
            for (std::ptrdiff_t done = 0; done < count; done += chunk) {
                const std::ptrdiff_t k = std::min(chunk, count - done);
                rows(dp + done * dstep, sp + done * sstep, k);
                if (pr.add(static_cast<std::size_t>(k * run))) return true;
            }
            return false;
        });
    }
}

// copy_layouts() past the one-run case, with progress type P (Progress or NoProgress).
template <class P>
CopyStatus copy_strided(const Layout& d, const Layout& s, std::size_t total, const CopyCtx& cp, bool joint,
                        const StepCheck* check) {
    if (extents_overlap(d, s)) {
        // At least one side is strided: copy src out to a temporary first, which gives
        // np.copyto's result for any overlap.
        char* tmp = static_cast<char*>(std::malloc(total));
        if (!tmp) return CopyStatus::NoMemory;
        P pr(check, 2 * total);
        Layout t;
        t.ptr = tmp;
        if (joint) {
            reshape_contiguous_like(t, s);
            copy_joint(t, s, cp, pr);
            if (!pr.stopped()) copy_joint(d, t, cp, pr);
        } else {
            t.nd = 1;
            t.shape[0] = static_cast<std::ptrdiff_t>(total);
            t.strides[0] = 1;
            copy_runs(t, s, total, cp, pr);
            if (!pr.stopped()) copy_runs(d, t, total, cp, pr);
        }
        std::free(tmp);
        return pr.stopped() ? CopyStatus::Interrupted : CopyStatus::Ok;
    }
    P pr(check, total);
    if (joint) copy_joint(d, s, cp, pr);
    else copy_runs(d, s, total, cp, pr);
    return pr.stopped() ? CopyStatus::Interrupted : CopyStatus::Ok;
}

}  // namespace

CopyStatus copy_layouts(const Layout& d, const Layout& s, std::size_t total, const CopyCtx& cp, bool joint,
                        const StepCheck* check) noexcept {
    try {
        if (d.nd == 1 && s.nd == 1) {  // one contiguous run each: memmove semantics cover any overlap
            if (check) return copy_contiguous_in_steps(d.ptr, s.ptr, total, cp, *check);
            cp(d.ptr, s.ptr, total);
            return CopyStatus::Ok;
        }
        if (check && check->stop) return copy_strided<Progress>(d, s, total, cp, joint, check);
        return copy_strided<NoProgress>(d, s, total, cp, joint, check);
    } catch (...) {
        return CopyStatus::Failed;
    }
}

CopyStatus copy_contiguous_in_steps(char* d, const char* s, std::size_t n, const CopyCtx& cp,
                                    const StepCheck& check) noexcept {
    try {
        if (!cp.forced && !cp.shared) {
            const std::size_t done = copy_bytes_in_steps(d, s, n, cp.region, check.step, check.stop, check.ctx);
            return done < n ? CopyStatus::Interrupted : CopyStatus::Ok;
        }
        if (cp.shared || runs_overlap(d, s, n)) {
            // One call: memmove semantics need the whole range at once, and a loan's store
            // mode judges whole writes.
            cp(d, s, n);
            return CopyStatus::Ok;
        }
        Progress pr(&check, n);
        for (std::size_t done = 0; done < n;) {
            const std::size_t m = std::min(check.step, n - done);
            cp(d + done, s + done, m);
            done += m;
            if (pr.add(m)) return CopyStatus::Interrupted;
        }
        return CopyStatus::Ok;
    } catch (...) {
        return CopyStatus::Failed;
    }
}

}  // namespace core
}  // namespace fastcopy
