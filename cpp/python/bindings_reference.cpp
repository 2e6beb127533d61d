// What the generated reference (tools/gen_reference.py, docs/reference/) reads: the built-in
// profiles as defaults.cpp writes them, the FASTCOPY_* overrides, and the limits of channels
// and topics. Read-only data from policy/ and the shared-memory headers; no decisions here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "policy/profile.h"
#include "shm/channel.h"
#include "shm/topic.h"

namespace py = pybind11;

namespace fastcopy {
namespace {

py::object size_or_none(std::size_t n) { return n == SIZE_MAX ? py::object(py::none()) : py::object(py::int_(n)); }

py::dict region_dict(const policy::BuiltinRegionSpec& r) {
    py::dict d;
    for (int c = 0; c < policy::kClasses; ++c) {
        py::list bands;
        const auto& bs = r.cls[c];
        for (std::size_t i = 0; i < bs.size(); ++i) {
            py::dict b;
            b["from"] = bs[i].from;
            b["to"] = size_or_none(i + 1 < bs.size() ? bs[i + 1].from : SIZE_MAX);
            b["kernel"] = bs[i].kernel;
            b["fallback"] = bs[i].fallback.empty() ? py::object(py::none()) : py::object(py::str(bs[i].fallback));
            b["why"] = bs[i].why;
            bands.append(b);
        }
        d[policy::class_key(c)] = bands;
    }
    d["rep_movsb_on"] = size_or_none(r.erms_on_request);
    d["rep_movsb_on_why"] = r.erms_on_request_why;
    return d;
}

py::list builtin_profile_table() {
    py::list out;
    for (const policy::BuiltinTable& t : policy::builtin_tables()) {
        py::dict d;
        d["name"] = t.name;
        d["match"] = t.match;
        d["rank"] = t.rank;
        py::dict prov;
        prov["machine"] = t.provenance.machine;
        prov["date"] = t.provenance.date;
        prov["libc"] = t.provenance.libc;
        prov["method"] = t.provenance.method;
        d["provenance"] = prov;
        py::dict regions;
        for (int r = 0; r < policy::kRegions; ++r) regions[policy::region_key(r)] = region_dict(t.region[r]);
        d["regions"] = regions;
        py::dict nt;
        nt["kernel"] = t.nt_kernel.empty() ? py::object(py::none()) : py::object(py::str(t.nt_kernel));
        nt["min_page_distance"] = t.nt_min_page_distance;
        nt["min_page_distance_below"] =
            t.nt_min_page_distance_below == SIZE_MAX ? py::object(py::none()) : py::object(py::int_(t.nt_min_page_distance_below));
        nt["learn_from"] = t.nt_learn_from == SIZE_MAX ? py::object(py::none()) : py::object(py::int_(t.nt_learn_from));
        auto examples = [](const std::vector<policy::NtExample>& from) {
            py::list out;
            for (const policy::NtExample& e : from) {
                py::dict x;
                x["l3"] = e.l3 ? py::object(py::int_(e.l3)) : py::object(py::none());
                x["threshold"] = size_or_none(e.threshold);
                x["why"] = e.why;
                out.append(x);
            }
            return out;
        };
        nt["examples"] = examples(t.nt_examples);
        nt["shared_examples"] = examples(t.shared_nt_examples);
        d["nt"] = nt;
        py::dict par;
        par["threshold"] = size_or_none(t.parallel_from);
        par["why"] = t.parallel_why;
        par["learn_from"] = size_or_none(t.split_learn_from);
        par["shared_from"] = size_or_none(t.parallel_shared_from);
        d["parallel"] = par;
        d["sve_trap_min_from"] = t.sve_trap_min_from ? py::object(py::int_(t.sve_trap_min_from)) : py::object(py::none());
        d["notes"] = t.notes;
        out.append(d);
    }
    return out;
}

py::list override_variables() {
    py::list out;
    for (const policy::OverrideVariable& v : policy::override_variables()) {
        py::dict d;
        d["name"] = v.name;
        d["values"] = v.values;
        d["effect"] = v.effect;
        d["default"] = v.default_value;
        d["min"] = v.max < v.min ? py::object(py::none()) : py::object(py::int_(v.min));
        d["max"] = v.max < v.min ? py::object(py::none()) : py::object(py::int_(v.max));
        out.append(d);
    }
    return out;
}

py::dict shm_limits() {
    py::dict d;
    d["channel_version"] = shm::kVersion;
    d["topic_version"] = shm::kTopicVersion;
    d["channel_min_capacity"] = shm::kMinCapacity;
    d["channel_max_capacity"] = shm::kMaxCapacity;
    d["channel_header_bytes"] = shm::kHeaderBytes;
    d["message_alignment"] = shm::kAlign;
    d["max_payload_bytes"] = shm::kMaxPayload;
    d["max_ndim"] = shm::kMaxNdim;
    d["max_dtype_chars"] = shm::kMaxDtypeLen;
    d["page_aligned_loan_bytes"] = shm::kPageAlignedLoanMin;
    d["topic_max_slots"] = shm::kTopicMaxSlots;
    d["topic_max_subscribers"] = shm::kTopicMaxSubscribers;
    d["topic_default_bytes"] = shm::kTopicDefaultBytes;
    d["topic_default_min_slots"] = shm::kTopicDefaultMinSlots;
    d["topic_default_max_slots"] = shm::kTopicDefaultMaxSlots;
    return d;
}

}  // namespace

void bind_reference(py::module_& m) {
    m.def("builtin_profile_table", &builtin_profile_table,
          "Every built-in profile as defaults.cpp writes it, not resolved for any CPU: name, match rule, rank, "
          "provenance, bands per region and class (with the fallback kernel), NT rule (with its threshold for a few "
          "L3 sizes), thread-pool rule, SVE trap rule and notes.");
    m.def("builtin_match_rule", &policy::builtin_match_rule, "How a CPU's built-in profile is chosen, in words.");
    m.def("override_variables", &override_variables,
          "Every FASTCOPY_* variable the C++ side reads: name, values, effect, default, min and max (None: no "
          "numeric bounds).");
    m.def("override_reading_rule", [] { return std::string(policy::override_reading_rule()); },
          "How every FASTCOPY_* variable is read, in words.");
    m.def("shm_limits", &shm_limits,
          "The limits of channels and topics: layout versions, capacity bounds, message and dtype limits, topic "
          "slot and subscriber bounds and defaults.");
}

}  // namespace fastcopy
