// Read-only views of detection and policy for fastcopy.info(), the profile entry points
// (load, inspect, evaluate) and the thread-count knob. No policy here: everything comes from
// cpu.h, dispatch.h, policy/ and pool.h.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>

#include "cpu.h"
#include "core/dispatch.h"
#include "evidence.h"
#include "kernels/registry.h"
#include "pool/pool.h"
#include "probe.h"
#include "policy/split_modes.h"
#include "policy/store_modes.h"
#include "python/store_modes_dict.h"

namespace py = pybind11;

namespace fastcopy {
namespace {

py::object size_or_none(std::size_t n) { return n == SIZE_MAX ? py::object(py::none()) : py::object(py::int_(n)); }

// Feeds a learner `copies` decisions (decide() -> the mode, record(mode) times it at a chosen
// rate); returns how many took mode 1 (streaming stores, or split). For the simulate_* tests.
template <class Decide, class Record>
int feed_learner(int copies, Decide decide, Record record) {
    int second = 0;
    for (int i = 0; i < copies; ++i) {
        const bool mode = decide();
        record(mode);
        second += mode ? 1 : 0;
    }
    return second;
}

py::dict facts_dict() {
    const CpuFacts& f = cpu_facts();
    py::dict d;
    d["arch"] = f.arch;
    d["vendor"] = f.vendor;
    d["family"] = f.family;
    d["model"] = f.model;
    d["stepping"] = f.stepping;
    d["hypervisor"] = f.hypervisor;
    py::dict flags;
    if (f.arch == "x86_64") {
        flags["erms"] = f.erms;
        flags["fsrm"] = f.fsrm;
        flags["avx"] = f.avx;
        flags["avx2"] = f.avx2;
        flags["avx512f"] = f.avx512f;
        flags["avx512bw"] = f.avx512bw;
        flags["avx512vl"] = f.avx512vl;
    } else if (f.arch == "aarch64") {
        flags["asimd"] = f.asimd;
        flags["sve"] = f.sve;
        flags["sve2"] = f.sve2;
        flags["mops"] = f.mops;
    }
    d["flags"] = flags;
    d["l1d_bytes"] = f.l1d;
    d["l2_bytes"] = f.l2;
    d["l3_bytes"] = f.l3;
    d["l3_cpuid_bytes"] = f.l3_cpuid;
    d["l3_sysfs_bytes"] = f.l3_sysfs;
    d["cache_source"] = f.cache_source;
    d["sve_vector_bytes"] = f.sve_vector_bytes;
    d["midr_implementer"] = f.midr_known ? py::object(py::int_(f.midr_implementer)) : py::object(py::none());
    d["midr_part"] = f.midr_known ? py::object(py::int_(f.midr_part)) : py::object(py::none());
    d["kernel_version"] = std::to_string(f.kernel_major) + "." + std::to_string(f.kernel_minor);
    d["sve_traps_after_syscall"] = f.sve_traps_after_syscall;
    d["usable_cpus"] = f.usable_cpus;
    return d;
}

py::list kernels_list() {
    py::list out;
    for (const auto& k : all_kernels()) {
        py::dict d;
        d["name"] = k.name;
        d["description"] = k.description;
        d["supported"] = k.supported;
        d["why_not"] = k.why_not;
        const KernelEntry* e = find_registry_entry(k.name);
        d["streaming"] = e && e->streaming;  // non-temporal stores, for copies larger than the caches
        d["twin"] = e && e->twin ? py::object(py::str(e->twin)) : py::object(py::none());
        out.append(d);
    }
    return out;
}

py::dict band_dict(const policy::Band& b, std::size_t to) {
    py::dict d;
    d["from"] = b.from;
    d["to"] = size_or_none(to);
    d["kernel"] = b.kernel;
    d["why"] = b.why;
    return d;
}

// A profile as it is executed, as a dict (docs/profile-format.md, plus where it came from).
py::dict profile_dict(const policy::Profile& p) {
    py::dict d;
    d["name"] = p.name;
    d["source"] = p.source;
    d["matched"] = p.matched_why;
    py::dict prov;
    prov["machine"] = p.provenance.machine;
    prov["date"] = p.provenance.date;
    prov["libc"] = p.provenance.libc;
    prov["method"] = p.provenance.method;
    d["provenance"] = prov;
    d["signature"] = p.signature_json.empty() ? py::object(py::none())
                                               : py::module_::import("json").attr("loads")(p.signature_json);
    py::dict regions;
    for (int r = 0; r < policy::kRegions; ++r) {
        const policy::RegionRules& rules = p.region[r];
        py::dict region;
        for (int c = 0; c < policy::kClasses; ++c) {
            py::list bands;
            const auto& bs = rules.cls[c];
            for (std::size_t i = 0; i < bs.size(); ++i)
                bands.append(band_dict(bs[i], i + 1 < bs.size() ? bs[i + 1].from : SIZE_MAX));
            region[policy::class_key(c)] = bands;
        }
        py::dict nt;
        nt["threshold"] = size_or_none(rules.nt.threshold);
        nt["kernel"] = rules.nt.kernel && rules.nt.threshold != SIZE_MAX ? py::object(py::str(rules.nt.kernel))
                                                                          : py::object(py::none());
        nt["min_page_distance"] = rules.nt.min_page_distance;
        nt["min_page_distance_below"] = size_or_none(rules.nt.min_page_distance_below);
        nt["learn_from"] = size_or_none(rules.nt.learn_from);
        nt["why"] = rules.nt.why;
        region["nt"] = nt;
        region["rep_movsb_on"] = size_or_none(rules.erms_on_request);
        regions[policy::region_key(r)] = region;
    }
    d["regions"] = regions;
    py::dict par;
    par["threshold"] = size_or_none(p.parallel.threshold);
    par["threads"] = p.parallel.threads;
    par["learn_from"] = size_or_none(p.parallel.learn_from);
    par["shared_from"] = size_or_none(policy::pool_threshold(p, Region::ToShared));
    par["why"] = p.parallel.why;
    d["parallel"] = par;
    d["notes"] = p.notes;
    d["overrides"] = p.overrides;
    d["forced_kernel"] = p.forced_kernel ? py::object(py::str(p.forced_kernel)) : py::object(py::none());
    return d;
}

// Flat view for info()["policy"]: one row per region, address class and band.
py::list policy_list() {
    py::list out;
    const policy::Profile& p = active_profile();
    for (int r = 0; r < policy::kRegions; ++r)
        for (int c = 0; c < policy::kClasses; ++c) {
            const auto& bs = p.region[r].cls[c];
            for (std::size_t i = 0; i < bs.size(); ++i) {
                py::dict d;
                d["region"] = policy::region_key(r);
                d["class"] = policy::class_key(c);
                d["min_bytes"] = bs[i].from;
                d["max_bytes"] = size_or_none(i + 1 < bs.size() ? bs[i + 1].from : SIZE_MAX);
                d["kernel"] = p.forced_kernel ? p.forced_kernel : bs[i].kernel;
                d["reason"] = p.forced_kernel ? std::string("forced by FASTCOPY_KERNEL") : bs[i].why;
                out.append(d);
            }
        }
    return out;
}

// A profile for choose_for(): JSON text, or the name of a built-in profile.
policy::Profile profile_from(const std::string& text) {
    std::size_t i = text.find_first_not_of(" \t\r\n");
    if (i != std::string::npos && text[i] == '{') return policy::parse_profile(text, "choose_for", cpu_facts());
    return policy::builtin_profile_named(text, cpu_facts());
}

py::dict overrides_dict() {
    const Overrides& o = overrides();
    py::dict d;
    d["FASTCOPY_KERNEL"] = o.kernel.empty() ? py::object(py::none()) : py::object(py::str(o.kernel));
    d["FASTCOPY_REP_MOVSB"] = o.rep_movsb;
    // The size-or-off variables: None when unset, "off", or the size in bytes.
    auto size_or_off = [](bool set, std::size_t n) {
        return !set ? py::object(py::none()) : n == SIZE_MAX ? py::object(py::str("off")) : py::object(py::int_(n));
    };
    d["FASTCOPY_NT_THRESHOLD"] = size_or_off(o.nt_threshold_set, o.nt_threshold);
    d["FASTCOPY_NT_LEARN_FROM"] = size_or_off(o.nt_learn_from_set, o.nt_learn_from);
    d["FASTCOPY_SPLIT_LEARN_FROM"] = size_or_off(o.split_learn_from_set, o.split_learn_from);
    d["FASTCOPY_THREADS"] = o.threads > 0 ? py::object(py::int_(o.threads)) : py::object(py::none());
    return d;
}

template <class F>
auto value_errors(F f) -> decltype(f()) {
    try {
        return f();
    } catch (const std::invalid_argument& e) {
        throw py::value_error(e.what());
    }
}

}  // namespace

void bind_info(py::module_& m) {
    m.def("init_policy", [] { value_errors([] { init_policy(); }); },
          "Re-read the FASTCOPY_* environment variables and apply them on top of the current profile (ValueError on "
          "a bad value; nothing changes then).");
    m.def("load_profile",
          [](const std::string& json_text, const std::string& source) {
              value_errors([&] { load_profile(json_text, source); });
          },
          py::arg("json_text"), py::arg("source"),
          "Validate and activate a dispatch profile (JSON text, docs/profile-format.md); ValueError naming the "
          "problem leaves the active profile unchanged.");
    m.def("validate_profile",
          [](const std::string& json_text) {
              value_errors([&] { policy::parse_profile(json_text, "check", cpu_facts()); });
          },
          py::arg("json_text"),
          "Check a dispatch profile (JSON text) as loading it would, against this CPU's kernels, without "
          "activating it: ValueError naming the first problem. The one validator of the format.");
    m.def("profile_limits", [] {
        py::dict d;
        d["format"] = policy::kProfileFormat;
        d["version"] = policy::kProfileVersion;
        d["max_bands"] = policy::kMaxBands;
        d["max_why_chars"] = policy::kMaxWhyChars;
        d["max_name_chars"] = policy::kMaxNameChars;
        d["max_notes"] = policy::kMaxNotes;
        d["max_file_bytes"] = policy::kMaxFileBytes;
        d["max_size_value"] = policy::kMaxSizeValue;
        d["min_nt_threshold"] = policy::kMinNtThreshold;
        d["min_nt_learn_from"] = policy::kMinNtLearnFrom;
        d["min_parallel_threshold"] = policy::kMinParallelThreshold;
        d["min_split_learn_from"] = policy::kMinSplitLearnFrom;
        d["max_threads"] = policy::kMaxThreads;
        d["max_min_page_distance"] = policy::kMaxPageDistance;
        d["max_json_depth"] = policy::kMaxJsonDepth;
        d["default_rep_movsb_on"] = policy::kGlibcRepMovsbFrom;
        return d;
    }, "The profile format's name, version and limits (docs/profile-format.md), as the loader applies them.");
    m.def("compact_json", [](const std::string& json_text) { return value_errors([&] { return policy::compact_json(json_text); }); },
          py::arg("json_text"),
          "JSON text as the profile reader writes it back compactly (how signature members are compared).");
    m.def("use_builtin_profile", [](const std::string& name) { value_errors([&] { use_builtin_profile(name); }); },
          py::arg("name") = "",
          "Go back to the built-in profile for this CPU; with a name, activate that built-in profile (resolved for "
          "this CPU: kernels it lacks fall back per band). ValueError for an unknown name.");
    m.def("active_profile", [] { return profile_dict(active_profile()); },
          "The profile every copy executes now, overrides included, as a dict.");
    m.def("active_profile_json", [] { return policy::to_json(active_profile()); },
          "The active profile as JSON in the profile format (to share, e.g. in a bug report).");
    m.def("base_profile", [] { return profile_dict(base_profile()); }, "The active profile before the overrides.");
    m.def("base_profile_json", [] { return policy::to_json(base_profile()); },
          "The active profile before the overrides, as JSON in the profile format (load_profile takes it back).");
    m.def("builtin_profiles", [] {
        py::list out;
        for (const auto& b : policy::builtin_profiles(cpu_facts())) {
            py::dict d;
            d["name"] = b.name;
            d["match"] = b.match;
            d["matches"] = b.matches;
            d["specificity"] = b.specificity;
            d["profile"] = profile_dict(policy::builtin_profile_named(b.name, cpu_facts()));
            out.append(d);
        }
        return out;
    }, "Every built-in profile (resolved against this CPU), its match rule and whether it matches.");
    m.def("profile_signature",
          [](const std::string& json_text) {
              return value_errors([&] {
                  py::dict d;
                  for (const auto& kv : policy::signature_fields(json_text)) d[py::str(kv.first)] = kv.second;
                  return d;
              });
          },
          py::arg("json_text"),
          "The profile's signature members as {key: compact JSON text of the value} (empty without one).");
    m.def("choose_for",
          [](const std::string& profile, std::uintptr_t dst, std::uintptr_t src, std::size_t n, int region) {
              if (region < 0 || region > 2)
                  throw py::value_error("region must be 0 (private), 1 (to_shared) or 2 (from_shared)");
              return value_errors([&] {
                  policy::Profile p = profile_from(profile);
                  return std::string(policy::choose(p, reinterpret_cast<const void*>(dst),
                                                    reinterpret_cast<const void*>(src), n, static_cast<Region>(region))
                                         .kernel);
              });
          },
          py::arg("profile"), py::arg("dst_address"), py::arg("src_address"), py::arg("nbytes"), py::arg("region") = 0,
          "The kernel a profile (JSON text or a built-in name) picks for these addresses and size, without the "
          "overrides; nothing is copied.");
    m.def("copy_plans",
          [](const std::string& profile, const std::vector<std::tuple<std::uintptr_t, std::uintptr_t, std::size_t, int>>& copies) {
              for (const auto& c : copies)
                  if (std::get<3>(c) < 0 || std::get<3>(c) > 2)
                      throw py::value_error("region must be 0 (private), 1 (to_shared) or 2 (from_shared)");
              return value_errors([&] {
                  const policy::Profile p = profile_from(profile);
                  std::vector<std::pair<std::string, int>> plans;
                  plans.reserve(copies.size());
                  for (const auto& c : copies) {
                      const void* dst = reinterpret_cast<const void*>(std::get<0>(c));
                      const void* src = reinterpret_cast<const void*>(std::get<1>(c));
                      const std::size_t n = std::get<2>(c);
                      plans.emplace_back(policy::choose(p, dst, src, n, static_cast<Region>(std::get<3>(c))).kernel,
                                         goes_to_pool(p, dst, src, n, static_cast<Region>(std::get<3>(c)))
                                             ? pool::threads()
                                             : 1);
                  }
                  return plans;
              });
          },
          py::arg("profile"), py::arg("copies"),
          "For each (dst_address, src_address, nbytes, region) of ``copies``: (kernel, threads), what a profile "
          "(JSON text or a built-in name) plans for that copy without the overrides and before any learning at run "
          "time: choose_for's kernel, on the thread pool's threads from its threshold for the region (parallel.threshold; for to_shared "
          "and from_shared at least parallel.shared_from; 1 below it, for overlapping copies, or with one thread set). Nothing is copied.");
    m.def("last_kernel", [] {
        CopyFn k = last_kernel();
        return k ? py::object(py::str(kernel_name(k))) : py::object(py::none());
    }, "The kernel this thread last ran (None after reset_last_kernel()): proves which kernel a copy used.");
    m.def("reset_last_kernel", &reset_last_kernel, "Forget the kernel this thread last ran.");
    m.def("private_store_modes", [] { return store_modes(private_store_modes()); },
          "What private copies from the profile's nt.learn_from measured: per size class, the store mode in use, "
          "the last rate of each mode and how many copies used it.");
    m.def("private_store_mode_rule", [] {
        const policy::StoreModeRule& r = policy::kPrivateCopyRule;
        py::dict d;
        d["explore_min"] = r.explore_min;
        d["explore_max"] = r.explore_max;
        d["explore_growth"] = r.explore_growth;
        d["explore_first_while_streaming"] = r.explore_first_while_streaming;
        d["streaming_trial_copies"] = r.streaming_trial_copies;
        d["cached_trial_copies"] = r.cached_trial_copies;
        d["trial_within"] = r.trial_within;
        d["judge_after"] = r.judge_after;
        d["rate_weight"] = r.rate_weight;
        d["to_streaming_margin"] = r.to_streaming_margin;
        d["to_cached_margin"] = r.to_cached_margin;
        d["slow_to_leave"] = r.slow_to_leave;
        d["why"] = "whether a copy finds its buffers in the last-level cache decides the store mode that wins: "
                   "cached stores 2-3x faster while it does, streaming stores 1.1-1.3x while it does not "
                   "(evidence: policy-private-store-modes)";
        return d;
    }, "The rule private copies from nt.learn_from follow to pick cached or streaming stores.");
    m.def("reset_private_store_modes", [] { private_store_modes().reset(); },
          "Forget what private copies measured (the next ones start with cached stores).");
    m.def("simulate_private_store_modes", [](std::size_t n, bool start_streaming, double cached_gbps,
                                              double streaming_gbps, int copies) {
        if (!(cached_gbps > 0) || !(streaming_gbps > 0) || copies < 0)
            throw py::value_error("simulate_private_store_modes: rates must be positive and copies at least 0");
        policy::StoreModeLearner& modes = private_store_modes();
        return feed_learner(copies, [&] { return modes.streaming(n, start_streaming); },
                            [&](bool st) { modes.record(n, st, double(n) / ((st ? streaming_gbps : cached_gbps) * 1e9)); });
    }, py::arg("nbytes"), py::arg("start_streaming"), py::arg("cached_gbps"), py::arg("streaming_gbps"),
       py::arg("copies"),
       "Feeds private copies' learner `copies` decisions for copies of nbytes as if each ran at the given rate of "
       "its mode (nothing is copied; tests reach a learned mode without depending on the CPU's timings). "
       "Returns how many were streamed.");
    m.def("private_split_modes", [] {
        const policy::SplitLearner& modes = private_split_modes();
        py::list out;
        for (int c = 0; c < modes.classes(); ++c) {
            const policy::SplitLearner::ClassState s = modes.state(c);
            if (s.alone_copies + s.split_copies == 0) continue;
            py::dict d;
            d["sizes"] = modes.class_name(c);
            d["mode"] = s.split ? "split" : "alone";
            d["alone_gbps"] = s.alone_rate / 1e9;
            d["split_gbps"] = s.split_rate / 1e9;
            d["alone_copies"] = s.alone_copies;
            d["split_copies"] = s.split_copies;
            d["switches"] = s.switches;
            out.append(d);
        }
        return out;
    }, "What private copies the profile splits across the pool measured (from private_split_rule()['min_bytes'], "
       "below nt.learn_from): per "
       "size class, whether they run split or on the caller alone now, the last rate of each and how many copies ran each way.");
    m.def("private_split_rule", [] {
        const policy::StoreModeRule& r = policy::kPrivateSplitRule;
        py::dict d;
        d["min_bytes"] = policy::SplitLearner::kMinBytes;
        d["explore_min"] = r.explore_min;
        d["explore_max"] = r.explore_max;
        d["explore_growth"] = r.explore_growth;
        d["explore_max_while_alone"] = r.explore_max_while_cached;
        d["split_trial_copies"] = r.streaming_trial_copies;
        d["alone_trial_copies"] = r.cached_trial_copies;
        d["judge_after"] = r.judge_after;
        d["rate_weight"] = r.rate_weight;
        d["to_split_margin"] = r.to_streaming_margin;
        d["to_alone_margin"] = r.to_cached_margin;
        d["slow_to_leave"] = r.slow_to_leave;
        d["why"] = "where the host runs the pool's CPUs decides what splitting gains: 1.6x at 384 KiB while they share a "
                   "cache, 0.6x while the host has moved them apart (evidence: policy-private-split)";
        return d;
    }, "The rule private copies the profile splits across the pool follow to split or run on the caller alone.");
    m.def("reset_private_split_modes", [] { private_split_modes().reset(); },
          "Forget what split private copies measured (the next ones start split, as the profile says).");
    m.def("simulate_private_split_modes", [](std::size_t n, double alone_gbps, double split_gbps, int copies) {
        if (!(alone_gbps > 0) || !(split_gbps > 0) || copies < 0)
            throw py::value_error("simulate_private_split_modes: rates must be positive and copies at least 0");
        policy::SplitLearner& modes = private_split_modes();
        return feed_learner(copies, [&] { return modes.split(n); },
                            [&](bool sp) { modes.record(n, sp, double(n) / ((sp ? split_gbps : alone_gbps) * 1e9)); });
    }, py::arg("nbytes"), py::arg("alone_gbps"), py::arg("split_gbps"), py::arg("copies"),
       "Feeds the split learner `copies` decisions for private copies of nbytes as if each ran at the given rate of "
       "its mode (nothing is copied; tests reach a learned mode without depending on the CPU's timings). "
       "Returns how many were split.");
    m.def("cpu_facts", &facts_dict, "The CPU facts detected at import, as a dict.");
    m.def("evidence", [] {
        py::list out;
        for (const evidence::Entry& e : evidence::entries()) {
            py::dict d;
            d["id"] = e.id;
            d["subject"] = e.subject;
            d["claim"] = e.claim;
            d["figures"] = e.figures;
            d["machine"] = e.machine;
            d["date"] = e.date;
            d["command"] = e.command;
            out.append(d);
        }
        return out;
    }, "Every entry of the evidence compiled into the module (docs/evidence/<subject>.md): id, subject, claim, "
       "figures, machine, date, command.");
    m.def("evidence_files", [] {
        py::dict d;
        for (std::size_t i = 0; i < evidence::kEmbeddedFileCount; ++i)
            d[py::str(evidence::kEmbeddedFiles[i].subject)] =
                py::str(evidence::kEmbeddedFiles[i].text, evidence::kEmbeddedFiles[i].size);
        return d;
    }, "The evidence files compiled into the module, as {subject: text}.");
    m.def("evidence_problems", [] { return evidence::problems(); },
          "Format problems of the compiled evidence files (empty when every entry is well formed).");
    m.def("evidence_check", [](const std::string& subject, const std::string& text) {
        return evidence::check_text(subject, text);
    }, py::arg("subject"), py::arg("text"), "The format problems of one evidence file's text (for tests).");
    m.def("evidence_cited", [](const std::string& text) { return evidence::cited_ids(text); }, py::arg("text"),
          "The evidence ids a text cites (the word 'evidence:' followed by ids separated by ', '), in order, without "
          "repeats.");
    m.def("kernel_table", &kernels_list, "Every kernel compiled in: name, description, supported, why_not, streaming, twin.");
    m.def("policy_table", &policy_list, "The policy: size bands per region with the chosen kernel and the reason.");
    m.def("policy_notes", &policy_notes, "Decisions that are not size bands, in words.");
    m.def("overrides", &overrides_dict, "The FASTCOPY_* overrides in force (None when not set).");
    m.def("nt_threshold", [] { return size_or_none(nt_threshold()); }, "Bytes from which non-temporal stores are used (None: never).");
    m.def("nt_reason", &nt_reason, "Why nt_threshold() is what it is, in words.");
    m.def("parallel_threshold", [] { return size_or_none(parallel_threshold()); },
          "Bytes from which copies are split across the thread pool (None: never).");
    m.def("parallel_reason", &parallel_reason, "The measurement behind parallel_threshold(), in words.");
    m.def("threads", [] { return pool::threads(); }, "Threads a large copy uses now (caller included).");
    m.def("cache_line_round_trip_ns", [](int cpu_a, int cpu_b, unsigned rounds, double limit_s) {
        if (!(limit_s > 0)) throw py::value_error("limit_s must be > 0");
        py::gil_scoped_release release;
        try {
            return probe::cache_line_round_trip_ns(cpu_a, cpu_b, rounds, limit_s);
        } catch (const std::invalid_argument& e) {
            py::gil_scoped_acquire gil;
            throw py::value_error(std::string("cache_line_round_trip_ns: ") + e.what());
        }
    }, py::arg("cpu_a"), py::arg("cpu_b"), py::arg("rounds") = 2048, py::arg("limit_s") = 0.5,
          "Nanoseconds for a cache line to go from CPU cpu_a to cpu_b and back (two pinned threads take turns "
          "writing it): how far apart the two CPUs are now. ValueError for a CPU outside the affinity mask, rounds "
          "outside 1..16777216 or "
          "cpu_a == cpu_b; RuntimeError when a thread cannot be pinned or the turns stall for limit_s.");
    m.def("pool_stats", [] {
        const pool::Stats s = pool::stats();
        py::dict d;
        d["parallel_copies"] = s.parallel_copies;
        d["busy_fallbacks"] = s.busy_fallbacks;
        d["chunks_by_workers"] = s.chunks_by_workers;
        d["pools_started"] = s.pools_started;
        d["late_events"] = s.late_events;
        d["backoff_fallbacks"] = s.backoff_fallbacks;
        d["asleep_fallbacks"] = s.asleep_fallbacks;
        d["worker_sleeps"] = s.worker_sleeps;
        return d;
    }, "Counters of the thread pool since import: copies split, copies done alone (pool busy, back-off after "
       "late workers, or an isolated copy under 2 MiB while the workers slept), chunks the workers copied, pool starts, "
       "late-worker events, times a worker stopped spinning and slept.");
    m.def("pool_sleeping_workers", [] { return pool::sleeping_workers(); },
          "Started pool workers that sleep on their futex now (a snapshot: the isolated-copy rule applies only "
          "when the workers a copy would use all sleep).");
    m.def("pool_worker_spin_seconds", [] { return double(pool::worker_spin_now_ns()) * 1e-9; },
          "How long idle pool workers spin before sleeping, as the last copy split over threads set it "
          "(worker_spin_rule()).");
    m.def("pool_last_worker_spin_seconds", [] { return double(pool::last_worker_spin_ns()) * 1e-9; },
          "How long the first pool worker spun (at most) before sleeping when it last became idle: "
          "worker_spin_rule()'s value for the copy it helped with.");
    m.def("isolated_copy_rule", [] {
        py::dict d;
        d["below_bytes"] = pool::kWakeWorkersMinBytes;
        d["gap_seconds"] = double(pool::kIsolatedGapNs) * 1e-9;
        d["rule"] = "a copy under below_bytes that comes more than gap_seconds after the previous one that reached the "
                    "pool, while every worker it would use sleeps, runs on the caller alone (the workers sleep on); "
                    "closer copies wake them";
        d["why"] = "waking a sleeping worker costs more than a second thread saves on an isolated copy under 2 MiB; "
                   "closer copies find the workers awake (evidence: pool-isolated-copies, pool-handoff-cost)";
        return d;
    }, "The thread pool's rule for isolated copies that find the workers asleep, with its measurement.");
    m.def("worker_spin_rule", [] {
        py::dict d;
        d["after_isolated_copy_seconds"] = double(pool::kWorkerSpinNs) * 1e-9;
        d["within_stream_seconds"] = double(pool::worker_spin_ns(0)) * 1e-9;
        d["rule"] = "an idle worker spins (yielding to other threads) before it sleeps on a futex: "
                    "within_stream_seconds after a copy that came within the isolated-copy gap of the previous one, "
                    "after_isolated_copy_seconds after others";
        d["why"] = "waking a sleeping worker costs tens of microseconds under a hypervisor; workers that stay awake "
                   "through a stream of copies make two threads faster than one there (evidence: "
                   "pool-worker-spin-stream, pool-handoff-cost)";
        return d;
    }, "How long idle pool workers spin before sleeping, with its measurement.");
    m.def("default_threads", [] { return pool::default_threads(); }, "Threads from CPU affinity and cgroup quota.");
    m.def("threads_reason", [] { return pool::threads_reason(); }, "Where the thread count comes from, in words.");
    m.def("set_threads", [](long n) {
        if (n < 0 || n > 1024) throw py::value_error("set_threads(n): n must be 0 (default) or 1 to 1024, got " + std::to_string(n));
        pool::set_threads(static_cast<unsigned>(n));
    }, py::arg("n"), "Set the thread count for large copies (1 disables threading, 0 restores the default).");
    m.def("chosen_kernel", [](std::uintptr_t dst, std::uintptr_t src, std::size_t n, int region) {
        if (region < 0 || region > 2) throw py::value_error("region must be 0 (private), 1 (to_shared) or 2 (from_shared)");
        return std::string(kernel_name(choose_kernel(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n,
                                                     static_cast<Region>(region))));
    }, py::arg("dst_address"), py::arg("src_address"), py::arg("nbytes"), py::arg("region") = 0,
       "Name of the kernel the policy picks for these addresses and size (nothing is copied).");
    m.def("chosen_split", [](std::uintptr_t dst, std::uintptr_t src, std::size_t n) {
        return goes_to_pool(active_profile(), reinterpret_cast<const void*>(dst), reinterpret_cast<const void*>(src), n);
    }, py::arg("dst_address"), py::arg("src_address"), py::arg("nbytes"),
       "Whether the active profile splits a copy of these addresses and size across the thread pool, before any "
       "learning at run time: from its parallel threshold, with more than one thread set, unless they overlap or a "
       "kernel is forced (nothing is copied).");
    m.def("learned_kernel", [](std::uintptr_t dst, std::uintptr_t src, std::size_t n) {
        return std::string(kernel_name(learned_kernel(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n)));
    }, py::arg("dst_address"), py::arg("src_address"), py::arg("nbytes"),
       "Name of the kernel a private copy of these addresses and size runs now: chosen_kernel's, or where "
       "copies learn their store mode, the one of the mode learned so far (outside trials; nothing is copied).");
    m.def("learned_split", [](std::uintptr_t dst, std::uintptr_t src, std::size_t n) {
        return learned_split(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
    }, py::arg("dst_address"), py::arg("src_address"), py::arg("nbytes"),
       "Whether a private copy of these addresses and size runs split across the thread pool now: from the "
       "parallel threshold, as the split learned so far says (outside trials; nothing is copied).");
}

}  // namespace fastcopy
