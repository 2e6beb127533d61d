// C++ tests of cpp/core's copy front end without Python: the layout algebra (plan_pair,
// normalize_joint, to_byte_runs, extents), copy_layouts against a naive element loop
// (overlap, negative strides, zero-size dimensions, broadcast-style zero strides), step
// checks, the batch engine (items, aliasing pairs, checks) and the error kinds and texts.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "core/batch.h"
#include "core/copy_errors.h"
#include "core/layout.h"
#include "core/read_only_ranges.h"
#include "core/strided_copy.h"
#include "policy/profile.h"

using namespace fastcopy;
using namespace fastcopy::core;

namespace {

struct Arr {  // an operand over a buffer: offset of element 0, shape, strides (bytes)
    std::vector<std::ptrdiff_t> shape, strides;
    std::ptrdiff_t offset = 0, itemsize = 1;
    OperandDesc desc(std::vector<unsigned char>& buf) const {
        OperandDesc d;
        d.ptr = reinterpret_cast<char*>(buf.data()) + offset;
        d.itemsize = itemsize;
        d.ndim = static_cast<int>(shape.size());
        d.shape = shape.data();
        d.strides = strides.data();
        std::size_t n = static_cast<std::size_t>(itemsize);
        for (auto s : shape) n *= static_cast<std::size_t>(s);
        d.nbytes = n;
        return d;
    }
};

// Element offsets of an operand in C order.
std::vector<std::ptrdiff_t> element_offsets(const Arr& a) {
    std::vector<std::ptrdiff_t> out;
    std::size_t count = 1;
    for (auto s : a.shape) count *= static_cast<std::size_t>(s);
    std::vector<std::ptrdiff_t> idx(a.shape.size(), 0);
    for (std::size_t k = 0; k < count; ++k) {
        std::ptrdiff_t off = a.offset;
        for (std::size_t i = 0; i < idx.size(); ++i) off += idx[i] * a.strides[i];
        out.push_back(off);
        for (int i = static_cast<int>(idx.size()) - 1; i >= 0; --i) {
            if (++idx[i] < a.shape[i]) break;
            idx[i] = 0;
        }
    }
    return out;
}

// np.copyto's result: read every src element first, then write them to dst in order.
void reference_copy(std::vector<unsigned char>& buf, const Arr& d, const Arr& s) {
    auto doff = element_offsets(d), soff = element_offsets(s);
    std::vector<unsigned char> vals;
    for (auto o : soff) vals.insert(vals.end(), buf.begin() + o, buf.begin() + o + s.itemsize);
    std::size_t k = 0;
    for (auto o : doff)
        for (std::ptrdiff_t b = 0; b < d.itemsize; ++b) buf[static_cast<std::size_t>(o + b)] = vals[k++];
}

std::vector<unsigned char> pattern(std::size_t n) {
    std::vector<unsigned char> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(i * 7 + 3);
    return v;
}

// copy_layouts (through plan_pair) over one buffer against reference_copy.
bool copies_like_numpy(const Arr& d, const Arr& s, std::size_t bufsize, const StepCheck* check = nullptr) {
    auto got = pattern(bufsize), want = got;
    OperandDesc dd = d.desc(got), sd = s.desc(got);
    if (dd.nbytes != sd.nbytes) return false;
    if (dd.nbytes) {
        Layout dl, sl;
        bool joint = plan_pair(dd, sd, dl, sl);
        if (copy_layouts(dl, sl, dd.nbytes, CopyCtx{}, joint, check) != CopyStatus::Ok) return false;
    }
    reference_copy(want, d, s);
    return got == want;
}

void test_layout_algebra() {
    std::vector<unsigned char> buf = pattern(4096);
    // A C-contiguous (4, 8) float64 pair merges to one run of 256 bytes.
    Arr c{{4, 8}, {64, 8}, 0, 8};
    Arr c2{{4, 8}, {64, 8}, 1024, 8};
    Layout dl, sl;
    CHECK(plan_pair(c.desc(buf), c2.desc(buf), dl, sl));
    CHECK(dl.nd == 1 && dl.shape[0] == 256 && dl.strides[0] == 1);
    // Every other column: 8-byte runs, 4 x 4 of them.
    Arr strided{{4, 4}, {64, 16}, 0, 8};
    Arr packed{{4, 4}, {32, 8}, 2048, 8};
    CHECK(plan_pair(packed.desc(buf), strided.desc(buf), dl, sl));
    CHECK(sl.shape[sl.nd - 1] == 8 && sl.strides[sl.nd - 1] == 1);
    // A reversed dst axis is flipped in both layouts: dst runs forward from its last element,
    // src backward from its last one.
    Arr rev{{16}, {-8}, 15 * 8, 8};
    Arr fwd{{16}, {8}, 1024, 8};
    CHECK(plan_pair(rev.desc(buf), fwd.desc(buf), dl, sl));
    CHECK(dl.nd == 2 && dl.strides[0] == 8 && sl.strides[0] == -8 && dl.ptr == reinterpret_cast<char*>(buf.data()));
    CHECK(sl.ptr == reinterpret_cast<char*>(buf.data()) + 1024 + 15 * 8);
    // to_byte_runs of a contiguous operand is one run.
    Layout l;
    element_layout(c.desc(buf), l);
    to_byte_runs(l, 8);
    CHECK(l.nd == 1 && l.shape[0] == 256);
    // Extents with negative strides.
    std::uintptr_t lo, hi;
    operand_extent(rev.desc(buf), lo, hi);
    CHECK(lo == reinterpret_cast<std::uintptr_t>(buf.data()) && hi == lo + 128);
    // Contiguity: size-1 dimensions may have any stride; empty operands count as contiguous.
    Arr odd{{1, 8}, {12345, 8}, 0, 8};
    CHECK(is_c_contiguous(odd.desc(buf)));
    CHECK(!is_c_contiguous(strided.desc(buf)));
    Arr empty{{0, 8}, {8, 1}, 0, 1};
    CHECK(is_c_contiguous(empty.desc(buf)));
}

void test_copy_layouts() {
    // Non-overlapping strided pairs, both directions, several item sizes and runs.
    CHECK(copies_like_numpy({{8, 4}, {64, 16}, 0, 8}, {{8, 4}, {32, 8}, 2048, 8}, 4096));
    CHECK(copies_like_numpy({{8, 4}, {32, 8}, 2048, 8}, {{8, 4}, {64, 16}, 0, 8}, 4096));
    CHECK(copies_like_numpy({{5, 7, 3}, {300, 40, 12}, 0, 4}, {{5, 7, 3}, {84, 12, 4}, 2000, 4}, 4096));
    CHECK(copies_like_numpy({{6, 5}, {200, 80}, 0, 80}, {{6, 5}, {400, 80}, 1300, 80}, 4096));
    // Negative strides on either side.
    CHECK(copies_like_numpy({{16}, {-8}, 15 * 8, 8}, {{16}, {8}, 1024, 8}, 2048));
    CHECK(copies_like_numpy({{4, 6}, {-48, 8}, 3 * 48, 8}, {{4, 6}, {8, -32}, 1024 + 5 * 32, 8}, 2048));
    // Overlapping strided layouts (the temporary path), including a reversed self-copy.
    CHECK(copies_like_numpy({{32}, {-4}, 31 * 4, 4}, {{32}, {4}, 0, 4}, 256));
    CHECK(copies_like_numpy({{16}, {8}, 4, 4}, {{16}, {8}, 0, 4}, 256));
    CHECK(copies_like_numpy({{10, 3}, {24, 8}, 8, 8}, {{10, 3}, {24, 8}, 0, 8}, 512));
    // Overlapping contiguous runs: memmove semantics.
    CHECK(copies_like_numpy({{100}, {1}, 7, 1}, {{100}, {1}, 0, 1}, 256));
    CHECK(copies_like_numpy({{100}, {1}, 0, 1}, {{100}, {1}, 7, 1}, 256));
    // Zero strides on the source (a broadcast view, as numpy's broadcast_to gives).
    CHECK(copies_like_numpy({{6, 4}, {32, 8}, 1024, 8}, {{6, 4}, {0, 8}, 0, 8}, 2048));
    // Different shapes, equal byte counts (raw buffers): C-order byte sequences pair up.
    CHECK(copies_like_numpy({{4, 4}, {64, 8}, 0, 8}, {{128}, {1}, 1024, 1}, 2048));
    CHECK(copies_like_numpy({{3, 8}, {100, 4}, 0, 4}, {{4, 6}, {80, 4}, 1024, 4}, 2048));
    // Zero-size dimensions copy nothing.
    CHECK(copies_like_numpy({{0, 4}, {32, 8}, 0, 8}, {{0, 4}, {32, 8}, 512, 8}, 1024));
}

struct Counter {
    int calls = 0;
    int stop_at = -1;
};
bool count_stop(void* ctx) {
    auto* c = static_cast<Counter*>(ctx);
    return ++c->calls == c->stop_at;
}

void test_step_checks() {
    // 64 rows of 64 bytes with a check every 1 KiB: 3 checks (never after the last byte).
    Arr d{{64, 8}, {128, 8}, 0, 8}, s{{64, 8}, {64, 8}, 8192, 8};
    Counter c;
    StepCheck check{1024, count_stop, &c};
    CHECK(copies_like_numpy(d, s, 16384, &check));
    CHECK(c.calls == 3);
    // A check that stops the copy: Interrupted, and the rows after the step stay untouched.
    auto buf = pattern(16384), before = buf;
    Counter stop1;
    stop1.stop_at = 1;
    StepCheck halt{1024, count_stop, &stop1};
    OperandDesc dd = d.desc(buf), sd = s.desc(buf);
    Layout dl, sl;
    bool joint = plan_pair(dd, sd, dl, sl);
    CHECK(copy_layouts(dl, sl, dd.nbytes, CopyCtx{}, joint, &halt) == CopyStatus::Interrupted);
    CHECK(std::memcmp(buf.data() + 63 * 128, before.data() + 63 * 128, 64) == 0);
    CHECK(std::memcmp(buf.data(), before.data() + 8192, 64) == 0);
    // One long row of 1-byte elements (the inline loop) is cut into steps as well.
    Counter rc;
    StepCheck rows{1000, count_stop, &rc};
    CHECK(copies_like_numpy({{10000}, {2}, 0, 1}, {{10000}, {1}, 20000, 1}, 30000, &rows));
    CHECK(rc.calls == 9);
    // Contiguous copies step too.
    std::vector<unsigned char> a = pattern(10000), b(10000, 0);
    Counter cc;
    StepCheck every{1000, count_stop, &cc};
    CHECK(copy_contiguous_in_steps(reinterpret_cast<char*>(b.data()), reinterpret_cast<char*>(a.data()), 10000,
                                   CopyCtx{}, every) == CopyStatus::Ok);
    CHECK(a == b && cc.calls == 9);
}

void test_batch() {
    std::vector<unsigned char> src = pattern(1 << 16), dst(1 << 16, 0);
    Batch batch;
    // Blocks of 1, 8, 40 and 300-byte rows with strides, covering every copy_rows branch.
    std::size_t off = 0;
    for (std::size_t run : {1, 8, 40, 300}) {
        batch.blocks.push_back({reinterpret_cast<char*>(dst.data()) + off, reinterpret_cast<char*>(src.data()) + off, run,
                                10, static_cast<std::ptrdiff_t>(run + 3), static_cast<std::ptrdiff_t>(run + 5)});
        batch.total += run * 10;
        off += (run + 5) * 10 + 64;
    }
    std::vector<unsigned char> want(1 << 16, 0);
    for (const Block& b : batch.blocks)
        for (std::size_t r = 0; r < b.count; ++r)
            std::memcpy(want.data() + (b.dst - reinterpret_cast<char*>(dst.data())) + r * b.dstride,
                        b.src + r * b.sstride, b.run);
    CHECK(run_batch(batch));
    CHECK(dst == want);
    // Items cover every byte once, whatever the target.
    for (std::size_t target : {1, 64, 500, 1 << 20}) {
        make_items(batch, target);
        std::size_t sum = 0;
        for (const Item& it : batch.items) sum += item_bytes(batch, it);
        CHECK(sum == batch.total);
    }
    // A stepped batch checks between windows and stops when told.
    std::fill(dst.begin(), dst.end(), 0);
    Counter c;
    StepCheck check{512, count_stop, &c};
    CHECK(run_batch(batch, &check) && dst == want && c.calls >= 2);
    std::fill(dst.begin(), dst.end(), 0);
    Counter s1;
    s1.stop_at = 1;
    StepCheck halt{512, count_stop, &s1};
    CHECK(!run_batch(batch, &halt) && dst != want);
}

void test_pairs_interfere() {
    auto span = [](std::uintptr_t lo, std::uintptr_t hi, bool d) { return Span{lo, hi, d}; };
    std::vector<Span> apart = {span(0, 10, true), span(100, 110, false), span(20, 30, true), span(120, 130, false)};
    CHECK(!pairs_interfere(apart));
    std::vector<Span> shared_src = {span(0, 10, true), span(100, 110, false), span(20, 30, true), span(100, 110, false)};
    CHECK(!pairs_interfere(shared_src));  // two pairs reading one source is fine
    std::vector<Span> dst_dst = {span(0, 10, true), span(100, 110, false), span(5, 15, true), span(200, 210, false)};
    CHECK(pairs_interfere(dst_dst));
    std::vector<Span> dst_src = {span(0, 10, true), span(100, 110, false), span(200, 210, true), span(8, 18, false)};
    CHECK(pairs_interfere(dst_src));
    std::vector<Span> self = {span(0, 10, true), span(9, 19, false)};
    CHECK(pairs_interfere(self));
    std::vector<Span> touching = {span(0, 10, true), span(10, 20, false)};
    CHECK(!pairs_interfere(touching));
}

void test_errors() {
    std::vector<unsigned char> buf = pattern(256);
    Arr a{{2, 3}, {24, 8}, 0, 8}, b{{3, 2}, {16, 8}, 64, 8};
    OperandDesc da = a.desc(buf), db = b.desc(buf);
    CHECK(check_pair(da, db, true, true) == CopyError::ShapeMismatch);
    CHECK(check_pair(da, da, true, false) == CopyError::DtypeMismatch);
    CHECK(check_pair(da, db, false, false) == CopyError::None);  // equal byte counts
    Arr c{{5}, {8}, 0, 8};
    CHECK(check_pair(da, c.desc(buf), false, false) == CopyError::SizeMismatch);
    CHECK(error_type(CopyError::ShapeMismatch) == ErrorType::ValueError);
    CHECK(error_type(CopyError::DtypeMismatch) == ErrorType::TypeError);
    CHECK(error_type(CopyError::ExportFailed) == ErrorType::Original);
    ErrorFacts f = pair_facts(CopyError::ShapeMismatch, da, db, "", "");
    std::string m = error_message(ErrorSite{"copy"}, CopyError::ShapeMismatch, f);
    CHECK(m.find("fastcopy.copy: shape mismatch: dst has shape (2, 3) but src has shape (3, 2)") == 0);
    CHECK(m.find("nothing was copied") == std::string::npos);
    std::string many = error_message(ErrorSite{"copy_many", 4}, CopyError::ShapeMismatch, f);
    CHECK(many.find("fastcopy.copy_many: pair 4: shape mismatch") == 0);
    CHECK(many.size() > 20 && many.compare(many.size() - 20, 20, "; nothing was copied") == 0);
    ErrorFacts ro;
    std::string r = error_message(ErrorSite{"copy_many", 0}, CopyError::ReadOnlyArray, ro);
    CHECK(r.find("nothing was copied") == r.rfind("nothing was copied"));  // said once
    CHECK(shape_text(1, c.shape.data()) == "(5,)" && shape_text(0, nullptr) == "()");
    CHECK(format_has_objects("O") && format_has_objects("T{<i:a:O:b:}") && !format_has_objects("T{<i:Other:}"));
}

// policy::address_class (the rule's one definition) agrees with the classifier the dispatcher
// runs, at every distance mod 4096 around the class edges and for backward overlaps.
void test_address_class() {
    using policy::AddressClass;
    static char buf[3 * 4096];
    char* src = buf + 4096;
    for (std::ptrdiff_t dist : {-4096, -4095, -64, -63, -1, 0, 1, 63, 64, 65, 4095, 4096, 4097, 4096 + 63, 4096 + 64})
        for (std::size_t n : {std::size_t(1), std::size_t(64), std::size_t(5000)}) {
            char* dst = src + dist;
            CHECK(policy::address_class(dst, src, n) == policy::classify(dst, src, n));
        }
    CHECK(policy::address_class(src + 1, src, 100) == AddressClass::Backward);
    CHECK(policy::address_class(src + 63, src + 4096, 1) == AddressClass::Near);
    CHECK(policy::address_class(src + 64, src, 1) == AddressClass::Far);
    CHECK(policy::address_class(src, src, 1) == AddressClass::PageAligned);
}

void test_read_only_ranges() {
    static char buf[4 * 4096];
    const auto at = [](std::size_t off) { return reinterpret_cast<std::uintptr_t>(buf) + off; };
    CHECK(!dst_is_read_only_shared(buf, sizeof buf));
    set_read_only_range(buf + 4096, 2 * 4096, true);
    CHECK(g_read_only_range_count.load() == 1);
    CHECK(dst_is_read_only_shared(buf + 4096, 1));
    CHECK(dst_is_read_only_shared(buf, 4097));                // ends one byte inside
    CHECK(dst_is_read_only_shared(buf + 3 * 4096 - 1, 100));  // starts one byte inside
    CHECK(!dst_is_read_only_shared(buf, 4096));               // ends where the range starts
    CHECK(!dst_is_read_only_shared(buf + 3 * 4096, 4096));    // starts where it ends
    CHECK(!dst_is_read_only_shared(buf + 4096, 0));           // nothing to write
    CHECK(overlaps_read_only_range(at(0), at(sizeof buf)));
    set_read_only_range(buf + 4096, 2 * 4096, false);        // writable again: forgotten
    CHECK(g_read_only_range_count.load() == 0 && !dst_is_read_only_shared(buf + 4096, 1));
    set_read_only_range(buf + 4096, 4096, true);
    set_read_only_range(buf + 2 * 4096, 4096, true);
    forget_read_only_ranges_in(buf, sizeof buf);             // the region is unmapped
    CHECK(g_read_only_range_count.load() == 0 && !dst_is_read_only_shared(buf, sizeof buf));
    // More ranges than the lock-free table holds: the rest are found too.
    static char many[300 * 32];
    for (int i = 0; i < 300; ++i) set_read_only_range(many + 32 * i, 16, true);
    CHECK(g_read_only_range_count.load() == 300);
    CHECK(dst_is_read_only_shared(many, 1) && dst_is_read_only_shared(many + 32 * 299 + 15, 1));
    CHECK(!dst_is_read_only_shared(many + 32 * 299 + 16, 16));  // the gap after the last range
    set_read_only_range(many + 32 * 299, 16, false);
    CHECK(!dst_is_read_only_shared(many + 32 * 299, 16) && g_read_only_range_count.load() == 299);
    forget_read_only_ranges_in(many, sizeof many);
    CHECK(g_read_only_range_count.load() == 0 && !dst_is_read_only_shared(many, sizeof many));
}

// Copies read the table while consumer ends come and go on other threads: a range that stays is
// always found, one never registered never is (and, under TSan, no data race).
void test_read_only_ranges_under_change() {
    static char fixed[4096], moving[4096], never[4096];
    set_read_only_range(fixed, sizeof fixed, true);
    // The writer starts once the reader has read: on a loaded machine it could otherwise finish
    // before the reader runs at all.
    std::atomic<bool> stop{false}, reading{false};
    std::thread writer([&] {
        while (!reading.load()) std::this_thread::yield();
        for (int i = 0; i < 20000; ++i) {
            set_read_only_range(moving, sizeof moving, true);
            forget_read_only_ranges_in(moving, sizeof moving);
        }
        stop.store(true);
    });
    long wrong = 0;
    do {
        wrong += !dst_is_read_only_shared(fixed + 100, 8);
        wrong += dst_is_read_only_shared(never, sizeof never);
        reading.store(true);
    } while (!stop.load());
    writer.join();
    CHECK(wrong == 0);
    set_read_only_range(fixed, sizeof fixed, false);
    CHECK(g_read_only_range_count.load() == 0);
}

}  // namespace

int main() {
    test_address_class();
    test_layout_algebra();
    test_copy_layouts();
    test_step_checks();
    test_batch();
    test_pairs_interfere();
    test_errors();
    test_read_only_ranges();
    test_read_only_ranges_under_change();
    return checks_passed("core_tests");
}
