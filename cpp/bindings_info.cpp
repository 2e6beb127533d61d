// Read-only views of detection and policy for fastcopy.info(), plus the thread-count knob.
// No policy here: everything comes from cpu.h, dispatch.h and pool.h.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>

#include "cpu.h"
#include "dispatch.h"
#include "kernels/registry.h"
#include "pool.h"

namespace py = pybind11;

namespace fastcopy {
namespace {

py::object size_or_none(std::size_t n) { return n == SIZE_MAX ? py::object(py::none()) : py::object(py::int_(n)); }

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

py::list policy_list() {
    py::list out;
    for (const auto& r : describe_policy()) {
        py::dict d;
        d["region"] = r.region;
        d["min_bytes"] = r.min_bytes;
        d["max_bytes"] = size_or_none(r.max_bytes);
        d["kernel"] = r.kernel;
        d["reason"] = r.reason;
        out.append(d);
    }
    return out;
}

py::dict overrides_dict() {
    const Overrides& o = overrides();
    py::dict d;
    d["FASTCOPY_KERNEL"] = o.kernel.empty() ? py::object(py::none()) : py::object(py::str(o.kernel));
    d["FASTCOPY_REP_MOVSB"] = o.rep_movsb;
    d["FASTCOPY_NT_THRESHOLD"] = o.nt_threshold_set ? size_or_none(o.nt_threshold) : py::object(py::none());
    d["FASTCOPY_THREADS"] = o.threads > 0 ? py::object(py::int_(o.threads)) : py::object(py::none());
    return d;
}

}  // namespace

void bind_info(py::module_& m) {
    m.def("init_policy", [] {
        try {
            init_policy();
        } catch (const std::invalid_argument& e) {
            throw py::value_error(e.what());
        }
    }, "Re-read the FASTCOPY_* environment variables and rebuild the policy (ValueError on a bad value).");
    m.def("cpu_facts", &facts_dict, "The CPU facts detected at import, as a dict.");
    m.def("kernel_table", &kernels_list, "Every kernel compiled in: name, description, supported, why_not, streaming, twin.");
    m.def("policy_table", &policy_list, "The policy: size bands per region with the chosen kernel and the reason.");
    m.def("policy_notes", &policy_notes, "Decisions that are not size bands, in words.");
    m.def("overrides", &overrides_dict, "The FASTCOPY_* overrides in force (None when not set).");
    m.def("nt_threshold", [] { return size_or_none(nt_threshold()); }, "Bytes from which non-temporal stores are used (None: never).");
    m.def("nt_reason", &nt_reason, "Why nt_threshold() is what it is, in words.");
    m.def("parallel_threshold", &parallel_threshold, "Bytes from which copies are split across the thread pool.");
    m.def("parallel_reason", &parallel_reason, "The measurement behind parallel_threshold(), in words.");
    m.def("threads", [] { return pool::threads(); }, "Threads a large copy uses now (caller included).");
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
}

}  // namespace fastcopy
