// A StoreModeLearner's state for Python: Channel.store_modes, Topic.store_modes and
// fastcopy.info()["private_store_modes"] read it through store_modes().
#pragma once
#include <pybind11/pybind11.h>

#include "policy/store_modes.h"

namespace fastcopy {

// One dict per size class that saw timed writes.
inline pybind11::list store_modes(const policy::StoreModeLearner& m) {
    namespace py = pybind11;
    py::list out;
    for (int c = 0; c < m.classes(); ++c) {
        const auto s = m.state(c);
        if (s.writes[0] + s.writes[1] == 0) continue;
        py::dict d;
        d["sizes"] = m.class_name(c);
        d["stores"] = s.current_streaming ? "streaming" : "cached";
        d["cached_gbps"] = s.rate[0] / 1e9;
        d["streaming_gbps"] = s.rate[1] / 1e9;
        d["cached_writes"] = s.writes[0];
        d["streaming_writes"] = s.writes[1];
        d["switches"] = s.switches;
        out.append(d);
    }
    return out;
}

}  // namespace fastcopy
