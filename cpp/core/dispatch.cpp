// The façade over cpp/policy/: keeps the active profile (built-in or loaded, with the
// FASTCOPY_* overrides on top) and runs the kernel policy::choose() picks. No rules here:
// every decision is a band, an NT rule or a parallel rule of the active profile.
#include "core/dispatch.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "kernels/registry.h"
#include "policy/select.h"
#include "policy/split_modes.h"
#include "policy/store_modes.h"
#include "pool/pool.h"

namespace fastcopy {
namespace {

// The kernel table: the registry, each kernel marked usable or not on this CPU.
std::vector<KernelInfo> build_kernel_table(const CpuFacts& f) {
    std::vector<KernelInfo> t;
    unsigned have = cpu_features(f);
    for (const KernelEntry& e : kernel_registry()) {
        unsigned missing = e.needs & ~have;
        t.push_back(KernelInfo{e.name, e.description, e.fn, missing == 0, missing_feature_words(missing)});
    }
    return t;
}

std::vector<KernelInfo>& kernel_table() {
    static std::vector<KernelInfo> table = build_kernel_table(cpu_facts());
    return table;
}

// Profiles are replaced rarely (import, tests); the old ones are kept so that a copy running
// in another thread (GIL released) never reads a freed profile.
std::mutex g_lock;
std::vector<std::unique_ptr<policy::Profile>>& kept() {
    static auto* v = new std::vector<std::unique_ptr<policy::Profile>>();
    return *v;
}
const policy::Profile* g_base = nullptr;
std::atomic<const policy::Profile*> g_active{nullptr};
Overrides g_overrides;

const policy::Profile& builtin_for_this_cpu() {
    static const policy::Profile* p = new policy::Profile(policy::builtin_profile(cpu_facts()));
    return *p;
}

// Installs base + overrides as the active profile. Caller holds g_lock.
void activate(const policy::Profile& base, const Overrides& o) {
    auto active = std::make_unique<policy::Profile>(base);
    policy::apply_overrides(*active, o, cpu_facts());
    auto kept_base = std::make_unique<policy::Profile>(base);
    g_base = kept_base.get();
    g_overrides = o;
    g_active.store(active.get(), std::memory_order_release);
    kept().push_back(std::move(kept_base));
    kept().push_back(std::move(active));
    unsigned threads = o.threads > 0 ? static_cast<unsigned>(o.threads) : base.parallel.threads;
    pool::set_env_threads(threads);
}

// C++ users (tests, benchmarks) that did not call init_policy(): out of line, so active()
// stays a load and a branch.
__attribute__((noinline, cold)) const policy::Profile& active_after_init() {
    init_policy();
    return *g_active.load(std::memory_order_acquire);
}

inline const policy::Profile& active() {
    const policy::Profile* p = g_active.load(std::memory_order_acquire);
    if (__builtin_expect(p == nullptr, 0)) return active_after_init();
    return *p;
}

// The one place kernels run: records the kernel for last_kernel() (one thread-local store).
__attribute__((tls_model("initial-exec"))) thread_local CopyFn t_last_kernel = nullptr;
inline void run(CopyFn k, void* dst, const void* src, std::size_t n) {
    t_last_kernel = k;
    k(dst, src, n);
}

// The streaming (non-temporal) twin of a usable cache-friendly kernel (avx2 -> avx2_nt), or
// the kernel itself when it streams already; nullptr when it has none (generic, erms, ...).
CopyFn streaming_twin(CopyFn k) {
    struct Pair { CopyFn cached, streaming; };
    static const std::vector<Pair>* pairs = [] {
        auto* v = new std::vector<Pair>();
        for (const KernelEntry& e : kernel_registry()) {
            const KernelInfo* self = nullptr;
            for (const auto& ki : kernel_table())
                if (ki.fn == e.fn) self = &ki;
            if (!self || !self->supported) continue;
            if (e.streaming) { v->push_back({e.fn, e.fn}); continue; }
            if (!e.twin) continue;
            const KernelEntry* t = find_registry_entry(e.twin);
            for (const auto& ki : kernel_table())
                if (t && t->streaming && ki.fn == t->fn && ki.supported) v->push_back({e.fn, t->fn});
        }
        return v;
    }();
    for (const Pair& p : *pairs)
        if (p.cached == k) return p.streaming;
    return nullptr;
}

}  // namespace

const std::vector<KernelInfo>& all_kernels() { return kernel_table(); }

const KernelInfo* find_kernel(const std::string& name) {
    for (const auto& k : kernel_table())
        if (k.name == name) return &k;
    return nullptr;
}

const char* kernel_name(CopyFn fn) {
    for (const auto& k : kernel_table())
        if (k.fn == fn) return k.name.c_str();
    return "unknown";
}

void init_policy() {
    Overrides o = policy::read_overrides(cpu_facts());  // throws before anything changes
    std::lock_guard<std::mutex> g(g_lock);
    activate(g_base ? *g_base : builtin_for_this_cpu(), o);
}

void load_profile(const std::string& json_text, const std::string& source) {
    policy::Profile p = policy::parse_profile(json_text, source, cpu_facts());  // throws before anything changes
    std::lock_guard<std::mutex> g(g_lock);
    activate(p, g_overrides);
}

void use_builtin_profile(const std::string& name) {
    if (!name.empty()) {
        policy::Profile p = policy::builtin_profile_named(name, cpu_facts());  // throws before anything changes
        std::lock_guard<std::mutex> g(g_lock);
        activate(p, g_overrides);
        return;
    }
    std::lock_guard<std::mutex> g(g_lock);
    activate(builtin_for_this_cpu(), g_overrides);
}

const policy::Profile& active_profile() { return active(); }
const policy::Profile& base_profile() {
    active();
    return *g_base;
}

const Overrides& overrides() { return g_overrides; }
std::vector<std::string> policy_notes() { return active().notes; }
std::size_t nt_threshold() { return active().region[0].nt.threshold; }
std::string nt_reason() { return active().region[0].nt.why; }
std::size_t parallel_threshold() { return active().parallel.threshold; }
std::string parallel_reason() { return active().parallel.why; }

CopyFn choose_kernel(void* dst, const void* src, std::size_t n, Region region) {
    return policy::choose(active(), dst, src, n, region).fn;
}

policy::StoreModeLearner& private_store_modes() {
    static policy::StoreModeLearner modes(policy::kPrivateCopyRule);
    return modes;
}

policy::SplitLearner& private_split_modes() {
    static policy::SplitLearner modes;
    return modes;
}

namespace {
// Whether a copy of n bytes goes to the pool: from the profile's threshold for the region, with
// more than one thread, no forced kernel and no overlap (the pool's chunks would race).
inline bool pooled_copy(const policy::Profile& p, const void* dst, const void* src, std::size_t n,
                        Region region = Region::Private) {
    return n >= policy::pool_threshold(p, region) && !p.forced && !policy::ranges_overlap(dst, src, n) &&
           pool::threads() > 1;
}

// The band's kernel (cached stores) a private copy of at least nt.learn_from bytes learns
// against the NT kernel, or nullptr where the copy runs as the profile says: overlapping
// copies, forced kernels, profiles without an NT kernel and bands whose kernel streams already.
CopyFn learning_cached_kernel(const policy::Profile& p, void* dst, const void* src, std::size_t n) {
    const policy::RegionRules& rules = p.region[static_cast<int>(Region::Private)];
    if (p.forced || !rules.nt.fn || policy::ranges_overlap(dst, src, n)) return nullptr;
    const CopyFn cached = policy::choose_band_inline(rules, dst, src, n).fn;
    return cached == rules.nt.fn ? nullptr : cached;
}

// A private copy of at least nt.learn_from bytes (copy_bytes checked the size): the band's
// kernel (cached stores) or the NT kernel, as private_store_modes() decides from the timings of
// earlier copies; this one is timed too. `chosen` is the profile's choice: the NT kernel where
// the rule streams this copy, and each size class starts in that mode. The rule's guard stands
// for what a static rule cannot see; timed copies see it (a streamed trial that 4K-aliases
// loses).
void copy_learning_store_mode(const policy::Profile& p, CopyFn chosen, void* dst, const void* src, std::size_t n) {
    const policy::NtRule& nt = p.region[static_cast<int>(Region::Private)].nt;
    const bool pooled = pooled_copy(p, dst, src, n);
    const CopyFn cached = learning_cached_kernel(p, dst, src, n);
    if (!cached) {
        if (pooled) {
            t_last_kernel = chosen;
            pool::parallel_copy(dst, src, n, chosen);
        } else {
            run(chosen, dst, src, n);
        }
        return;
    }
    policy::StoreModeLearner& modes = private_store_modes();
    const bool streaming = modes.streaming(n, chosen == nt.fn);
    const CopyFn k = streaming ? nt.fn : cached;
    const auto t0 = std::chrono::steady_clock::now();
    if (pooled) {
        t_last_kernel = k;
        pool::parallel_copy(dst, src, n, k);
    } else {
        run(k, dst, src, n);
    }
    modes.record(n, streaming, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// Whether private_split_modes() decides a private copy of n bytes that goes to the pool: from
// the profile's parallel.learn_from (never below the learner's smallest timed size), below
// nt.learn_from (those copies learn their store mode instead).
inline bool learns_split(const policy::Profile& p, std::size_t n) {
    static_assert(policy::kMinSplitLearnFrom >= policy::SplitLearner::kMinBytes, "untimed sizes cannot learn");
    return n >= p.parallel.learn_from && n < p.region[static_cast<int>(Region::Private)].nt.learn_from;
}

// A private copy that goes to the pool: split across it or on the caller alone, as
// private_split_modes() decides from the timings of earlier copies; this one is timed too.
// A split copy that no worker took part in (the pool busy or backing off, the worker not yet
// running) or that had to wake a worker is not recorded: it times the caller alone or the
// wake-up (a woken worker joins 60-190 us late, whole copies of 1-4 MiB), not splitting
// (evidence: policy-private-split, pool-wake-off-caller-cpu).
void copy_learning_split(CopyFn k, void* dst, const void* src, std::size_t n) {
    policy::SplitLearner& modes = private_split_modes();
    const bool split = modes.split(n);
    const auto t0 = std::chrono::steady_clock::now();
    pool::SplitResult done;
    if (split) {
        t_last_kernel = k;
        done = pool::parallel_copy(dst, src, n, k);
    } else {
        run(k, dst, src, n);
    }
    if (!split || (done.worker_chunks > 0 && !done.woke_worker))
        modes.record(n, split, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}
}  // namespace

bool goes_to_pool(const policy::Profile& p, const void* dst, const void* src, std::size_t n, Region region) {
    return pooled_copy(p, dst, src, n, region);
}

bool learned_split(void* dst, const void* src, std::size_t n) {
    const policy::Profile& p = active();
    if (!pooled_copy(p, dst, src, n)) return false;
    return !learns_split(p, n) || private_split_modes().settled_split(n);
}

CopyFn learned_kernel(void* dst, const void* src, std::size_t n) {
    const policy::Profile& p = active();
    const CopyFn chosen = policy::choose(p, dst, src, n, Region::Private).fn;
    const policy::NtRule& nt = p.region[static_cast<int>(Region::Private)].nt;
    const CopyFn cached = n >= nt.learn_from ? learning_cached_kernel(p, dst, src, n) : nullptr;
    if (!cached) return chosen;
    return private_store_modes().settled_streaming(n, chosen == nt.fn) ? nt.fn : cached;
}

namespace {
// copy_bytes() of a copy that may learn its store mode or go to the pool. Out of line, so the
// path of every other copy saves almost no registers and ends in a jump to the kernel.
__attribute__((noinline)) void copy_bytes_large(const policy::Profile& p, CopyFn k, void* dst, const void* src,
                                                std::size_t n, Region region) {
    // nt.learn_from is SIZE_MAX outside the private region and where the profile does not learn.
    if (n >= p.region[static_cast<int>(region)].nt.learn_from) {
        copy_learning_store_mode(p, k, dst, src, n);
        return;
    }
    if (pooled_copy(p, dst, src, n, region)) {
        if (region == Region::Private && learns_split(p, n)) {
            copy_learning_split(k, dst, src, n);
            return;
        }
        t_last_kernel = k;
        pool::parallel_copy(dst, src, n, k);
        return;
    }
    run(k, dst, src, n);
}
}  // namespace

void copy_bytes(void* dst, const void* src, std::size_t n, Region region) {
    const policy::Profile& p = active();
    const CopyFn k = policy::choose_inline(p, dst, src, n, region).fn;
    // The parallel threshold is the lowest of the regions' pool thresholds (pool_threshold()):
    // copy_bytes_large() decides the region's.
    if (__builtin_expect(n >= p.region[static_cast<int>(region)].nt.learn_from || n >= p.parallel.threshold, 0)) {
        copy_bytes_large(p, k, dst, src, n, region);
        return;
    }
    run(k, dst, src, n);
}

std::size_t copy_bytes_in_steps(void* dst, const void* src, std::size_t n, Region region, std::size_t step,
                                bool (*stop)(void* ctx), void* ctx) {
    const policy::Profile& p = active();
    if (step == 0 || n <= step || policy::ranges_overlap(dst, src, n)) {
        copy_bytes(dst, src, n, region);
        return n;
    }
    // Every step starts a multiple of `step` bytes in, so (dst - src) mod 4096 and the
    // alignments the choice looked at are those of the whole copy.
    const CopyFn k = policy::choose_inline(p, dst, src, n, region).fn;
    const bool parallel = n >= policy::pool_threshold(p, region) && !p.forced && pool::threads() > 1;
    char* d = static_cast<char*>(dst);
    const char* s = static_cast<const char*>(src);
    std::size_t done = 0;
    while (done < n) {
        const std::size_t m = std::min(step, n - done);
        if (parallel) {
            t_last_kernel = k;
            pool::parallel_copy(d + done, s + done, m, k);
        } else {
            run(k, d + done, s + done, m);
        }
        done += m;
        if (done < n && stop(ctx)) break;
    }
    return done;
}

void copy_bytes_to_shared(void* dst, const void* src, std::size_t n, policy::StoreModeLearner* mode) {
    const policy::Profile& p = active();
    if (!mode || p.forced || n < policy::StoreModeLearner::kMinBytes || policy::ranges_overlap(dst, src, n)) {
        copy_bytes(dst, src, n, Region::ToShared);
        return;
    }
    const CopyFn cached = policy::choose_inline(p, dst, src, n, Region::ToShared).fn;
    const CopyFn streaming = streaming_twin(cached);
    // Nothing to choose: no twin, the profile streams already, or a page distance where the
    // profile's NT rule forbids streaming stores (their loads 4K-alias the stores in flight).
    const std::uintptr_t off = (reinterpret_cast<std::uintptr_t>(dst) - reinterpret_cast<std::uintptr_t>(src)) & 4095;
    const policy::NtRule& nt = p.region[static_cast<int>(Region::ToShared)].nt;
    if (!streaming || streaming == cached || (off != 0 && off < nt.min_page_distance && n < nt.min_page_distance_below)) {
        copy_bytes(dst, src, n, Region::ToShared);
        return;
    }
    const bool use_streaming = mode->streaming(n);
    const CopyFn k = use_streaming ? streaming : cached;
    const auto t0 = std::chrono::steady_clock::now();
    if (n >= policy::pool_threshold(p, Region::ToShared) && pool::threads() > 1) {
        t_last_kernel = k;
        pool::parallel_copy(dst, src, n, k);
    } else {
        run(k, dst, src, n);
    }
    mode->record(n, use_streaming, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// The NT rule for one piece of a larger transfer: the size test is on the whole transfer.
inline bool nt_applies_piece(const policy::NtRule& nt, const void* dst, const void* src, std::size_t n) {
    policy::NtRule any_size = nt;
    any_size.threshold = 0;
    return nt.fn && policy::nt_applies(any_size, dst, src, n);
}

// Pieces below 2 KiB (a message's tail) are not worth streaming. Measured (shm helper, Intel
// VM): 256 KiB pieces from a hot ring into a 64 MiB destination ran 9.0-10.0 GB/s with
// avx2_nt against 4.7-5.3 GB/s with rep movsb.
void copy_bytes_piece(void* dst, const void* src, std::size_t n, std::size_t whole, Region region) {
    const policy::Profile& p = active();
    const policy::NtRule& nt = p.region[static_cast<int>(region)].nt;
    if (!p.forced && whole >= nt.threshold && n >= 2048 && nt_applies_piece(nt, dst, src, n)) {
        run(nt.fn, dst, src, n);
        return;
    }
    run(policy::choose(p, dst, src, n, region).fn, dst, src, n);
}

void copy_bytes_with(CopyFn kernel, void* dst, const void* src, std::size_t n) { run(kernel, dst, src, n); }

CopyFn last_kernel() { return t_last_kernel; }
void reset_last_kernel() { t_last_kernel = nullptr; }

}  // namespace fastcopy
