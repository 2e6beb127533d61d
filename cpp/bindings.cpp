// TEMPORARY minimal binding (contiguous buffers only) until the full copy API lands.
#include <pybind11/pybind11.h>

#include "dispatch.h"

namespace py = pybind11;

namespace fastcopy {
void bind_info(py::module_& m);
void bind_shm(py::module_& m);

static void copy_impl(py::buffer dst, py::buffer src, CopyFn forced, Region region) {
    py::buffer_info d = dst.request(true), s = src.request(false);
    std::size_t nd = static_cast<std::size_t>(d.size * d.itemsize), ns = static_cast<std::size_t>(s.size * s.itemsize);
    if (nd != ns) throw py::value_error("size mismatch");
    py::gil_scoped_release release;
    if (forced) copy_bytes_with(forced, d.ptr, s.ptr, nd);
    else copy_bytes(d.ptr, s.ptr, nd, region);
}
}  // namespace fastcopy

PYBIND11_MODULE(_core, m) {
    using namespace fastcopy;
    m.def("copy", [](py::buffer dst, py::buffer src) { copy_impl(dst, src, nullptr, Region::Private); });
    m.def("copy_with_kernel", [](const std::string& name, py::buffer dst, py::buffer src) {
        const KernelInfo* k = find_kernel(name);
        if (!k || !k->supported) throw py::value_error("bad kernel");
        copy_impl(dst, src, k->fn, Region::Private);
    });
    m.def("kernel_callable", [](const std::string& name) {
        const KernelInfo* k = find_kernel(name);
        if (!k || !k->supported) throw py::value_error("bad kernel " + name);
        CopyFn fn = k->fn;
        return py::cpp_function([fn](py::buffer dst, py::buffer src) { copy_impl(dst, src, fn, Region::Private); });
    });
    m.def("copy_region", [](py::buffer dst, py::buffer src, int region) { copy_impl(dst, src, nullptr, static_cast<Region>(region)); });
    bind_info(m);
    bind_shm(m);
}
