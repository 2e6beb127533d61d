// Copying between two byte layouts (layout.h): run by run, through the policy (copy_bytes) or
// one forced kernel, with a temporary when strided extents overlap, and an optional check
// every `step` bytes (Ctrl-C between steps of a long copy). No Python.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dispatch.h"
#include "core/layout.h"

namespace fastcopy {
namespace core {

// How each contiguous run is copied: the policy of `region`, a loan's store mode (`shared`),
// or one forced kernel (fastcopy.kernel(name, threads)): threads > 1 splits non-overlapping
// runs over the pool.
struct CopyCtx {
    CopyFn forced = nullptr;
    Region region = Region::Private;
    unsigned forced_threads = 1;
    policy::StoreModeLearner* shared = nullptr;
    void operator()(void* d, const void* s, std::size_t n) const;
};

// Called between steps of a long copy: stop(ctx) returning true ends the copy there.
struct StepCheck {
    std::size_t step = 0;  // bytes between calls
    bool (*stop)(void* ctx) = nullptr;
    void* ctx = nullptr;
};

// Counts bytes done and calls a StepCheck once per `step` bytes, never after the last byte.
class Progress {
public:
    Progress(const StepCheck* check, std::size_t total) : check_(check && check->stop ? check : nullptr), left_(total) {}
    // Records n more bytes done; true when the copy must stop now.
    bool add(std::size_t n) {
        left_ -= n < left_ ? n : left_;
        if (!check_) return false;
        since_ += n;
        if (since_ < check_->step || left_ == 0) return false;
        since_ = 0;
        return stopped_ = check_->stop(check_->ctx);
    }
    bool stopped() const { return stopped_; }
    // How many items of `item` bytes one step holds (at least 1; no check: all of them).
    std::size_t items_per_step(std::size_t item) const {
        if (!check_) return SIZE_MAX;
        const std::size_t k = check_->step / (item ? item : 1);
        return k ? k : 1;
    }

private:
    const StepCheck* check_;
    std::size_t left_;
    std::size_t since_ = 0;
    bool stopped_ = false;
};

enum class CopyStatus { Ok, NoMemory, Failed, Interrupted };

// Runs shorter than this are the elements of an element-wise strided copy (e.g. a[::2] of
// float64: 8-byte runs). They are moved inline with fixed-size moves, as numpy's strided
// loops do, instead of one copy_bytes() call each (~15 ns of call and dispatch per element,
// 20-45x slower than np.copyto). Every run of this length or more
// goes to copy_bytes(). Copies through a forced kernel always call that kernel.
constexpr std::ptrdiff_t kInlineRunBytes = 64;

// Copies the byte sequence of `s` into that of `d` (total bytes each), as planned by
// plan_pair (`joint`: identical shapes). Overlapping strided extents go through a temporary,
// which gives np.copyto's result for any overlap. `check` (may be nullptr) runs every
// check->step bytes; Interrupted when it stopped the copy (dst then partly written).
CopyStatus copy_layouts(const Layout& d, const Layout& s, std::size_t total, const CopyCtx& cp, bool joint,
                        const StepCheck* check = nullptr) noexcept;

// One contiguous copy of n bytes with `check` between steps of check->step bytes: the policy
// choice is made once for the whole n (copy_bytes_in_steps); a forced kernel runs step by
// step unless the ranges overlap. Interrupted when the check stopped it.
CopyStatus copy_contiguous_in_steps(char* d, const char* s, std::size_t n, const CopyCtx& cp,
                                    const StepCheck& check) noexcept;

}  // namespace core
}  // namespace fastcopy
