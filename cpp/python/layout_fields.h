// A header's layout for Python: a table of (name, byte offset, size) and the dict Python reads
// it as, name -> (offset, size). _core.shm_layout() and _core.net_wire_layout() build theirs
// from the constants of the C++ headers that define the layouts.
#pragma once
#include <cstddef>

#include <pybind11/pybind11.h>

namespace fastcopy {

struct LayoutField {
    const char* name;
    std::size_t offset;
    std::size_t size;
};

template <std::size_t N>
pybind11::dict layout_fields(const LayoutField (&table)[N]) {
    pybind11::dict d;
    for (const LayoutField& f : table) d[f.name] = pybind11::make_tuple(f.offset, f.size);
    return d;
}

}  // namespace fastcopy
