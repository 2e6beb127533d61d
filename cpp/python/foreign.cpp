// Arrays of other libraries read as numpy arrays (foreign.h).
#include "python/foreign.h"
#include "python/dlpack_exchange.h"
#include "python/pyerr.h"

#include <cstdint>
#include <cstring>

namespace fastcopy {

namespace {

// DLPack device types whose memory the CPU reads directly; numpy.from_dlpack accepts the same.
bool cpu_readable(long device_type) {
    switch (device_type) {
        case 1:    // kDLCPU
        case 3:    // kDLCUDAHost (pinned host memory)
        case 11:   // kDLROCMHost
        case 13:   // kDLCUDAManaged
            return true;
        default:
            return false;
    }
}

const char* device_name(long device_type) {
    switch (device_type) {
        case 2: return "CUDA";
        case 4: return "OpenCL";
        case 7: return "Vulkan";
        case 8: return "Metal";
        case 9: return "VPI";
        case 10: return "ROCm";
        case 12: return "an extension device";
        case 14: return "oneAPI";
        case 15: return "WebGPU";
        case 16: return "Hexagon";
        case 17: return "MAIA";
        default: return "a device";
    }
}

PyObject* numpy_function(const char* name) {
    PyObject* np = PyImport_ImportModule("numpy");
    if (!np) return nullptr;
    PyObject* f = PyObject_GetAttrString(np, name);
    Py_DECREF(np);
    return f;
}

constexpr const char* kNothingCopied = "; nothing was copied";
constexpr const char* kNoSuchDtypeHint =
    " (numpy has no such dtype, e.g. bfloat16: view it as an integer type of the same size first, e.g. "
    "tensor.view(torch.int16)); nothing was copied";

// Re-raises the pending exception as "<prefix()><its text><hint>", same type, original as
// __cause__ (prefix() runs with no exception pending: it may look attributes up).
void reraise_with_prefix(const std::function<std::string()>& prefix, const char* hint) {
    reraise_with_message([&](const std::string& original) { return prefix() + original + hint; });
}

// torch.Tensor when torch is imported (never imported here), else nullptr. Looked up again
// until torch appears in sys.modules.
PyTypeObject* torch_tensor_type() {
    static PyTypeObject* cached = nullptr;
    if (cached) return cached;
    PyObject* modules = PyImport_GetModuleDict();  // borrowed
    PyObject* torch = modules ? PyDict_GetItemString(modules, "torch") : nullptr;  // borrowed
    if (!torch) return nullptr;
    PyObject* tensor = PyObject_GetAttrString(torch, "Tensor");
    if (!tensor) {
        PyErr_Clear();
        return nullptr;
    }
    if (PyType_Check(tensor)) cached = reinterpret_cast<PyTypeObject*>(tensor);  // kept for the process
    else Py_DECREF(tensor);
    return cached;
}

// torch.Tensor's C descriptor for `name` (a strong reference, kept for the process), or
// nullptr when the name resolves to anything else (a Python override, a monkeypatched
// attribute): the direct route then stays off.
PyObject* c_descriptor(PyTypeObject* tensor, const char* name, PyTypeObject* kind) {
    PyObject* key = PyUnicode_InternFromString(name);
    if (!key) {
        PyErr_Clear();
        return nullptr;
    }
    PyObject* d = _PyType_Lookup(tensor, key);  // borrowed; never raises
    Py_DECREF(key);
    if (!d || Py_TYPE(d) != kind) return nullptr;
    Py_INCREF(d);
    return d;
}

// torch.Tensor's DLPack exchange table (dlpack_exchange.h) when it has one of major version 1
// that fills a DLTensor in place; nullptr otherwise.
const dlpack::ExchangeApi* exchange_api(PyTypeObject* tensor) {
    PyObject* capsule = PyObject_GetAttrString(reinterpret_cast<PyObject*>(tensor), "__dlpack_c_exchange_api__");
    if (!capsule) {
        PyErr_Clear();
        return nullptr;
    }
    void* p = PyCapsule_IsValid(capsule, dlpack::kExchangeApiCapsule)
                  ? PyCapsule_GetPointer(capsule, dlpack::kExchangeApiCapsule)
                  : nullptr;
    Py_DECREF(capsule);  // the table lives as long as the process (the standard's rule)
    // A newer major version chains the older tables it also provides.
    auto* header = static_cast<dlpack::ExchangeApiHeader*>(p);
    while (header && header->version.major > dlpack::kMajorVersion) header = header->prev_api;
    if (!header || header->version.major != dlpack::kMajorVersion) return nullptr;
    auto* api = reinterpret_cast<const dlpack::ExchangeApi*>(header);
    return api->dltensor_from_py_object_no_sync ? api : nullptr;
}

// What the direct tensor route needs of torch, looked up once torch.Tensor is known: the
// DLPack exchange table, which describes a tensor (device, dtype, shape, strides, data) in
// one C call, and torch.Tensor's own C descriptors for the three facts a DLTensor does not
// carry, called directly (no lookup through the type's MRO, no bound method; an attribute
// set on one tensor cannot stand in for torch's answer) (evidence: copy-foreign-array-cost).
struct TorchFacts {
    const dlpack::ExchangeApi* api = nullptr;
    PyObject* requires_grad = nullptr;  // a getset descriptor
    PyObject* is_neg = nullptr;         // method descriptors
    PyObject* is_conj = nullptr;
};

const TorchFacts* torch_facts() {
    static TorchFacts facts;
    static bool tried = false;
    if (tried) return facts.api ? &facts : nullptr;
    PyTypeObject* tensor = torch_tensor_type();
    if (!tensor) return nullptr;
    tried = true;
    facts.requires_grad = c_descriptor(tensor, "requires_grad", &PyGetSetDescr_Type);
    facts.is_neg = c_descriptor(tensor, "is_neg", &PyMethodDescr_Type);
    facts.is_conj = c_descriptor(tensor, "is_conj", &PyMethodDescr_Type);
    if (facts.requires_grad && facts.is_neg && facts.is_conj) facts.api = exchange_api(tensor);
    return facts.api ? &facts : nullptr;
}

// The descriptor's value for tensor `t` (a property read; a method called with no arguments)
// is exactly `want`.
bool value_is(PyObject* t, PyObject* descr, PyObject* want) {
    PyObject* v = Py_TYPE(descr) == &PyMethodDescr_Type
                      ? PyObject_Vectorcall(descr, &t, 1, nullptr)
                      : Py_TYPE(descr)->tp_descr_get(descr, t, reinterpret_cast<PyObject*>(Py_TYPE(t)));
    if (!v) {
        PyErr_Clear();
        return false;
    }
    const bool same = v == want;
    Py_DECREF(v);
    return same;
}

// The item size of a DLPack dtype that Tensor.numpy() turns into a numpy dtype (bool,
// signed and unsigned integers, float16/32/64, complex64/128); 0 for any other (bfloat16,
// the float8 kinds, vector lanes).
std::size_t numpy_itemsize(const dlpack::DataType& t) {
    if (t.lanes != 1) return 0;
    switch (t.code) {
        case dlpack::kDLBool: return t.bits == 8 ? 1 : 0;
        case dlpack::kDLInt:
        case dlpack::kDLUInt: return t.bits == 8 || t.bits == 16 || t.bits == 32 || t.bits == 64 ? t.bits / 8 : 0;
        case dlpack::kDLFloat: return t.bits == 16 || t.bits == 32 || t.bits == 64 ? t.bits / 8 : 0;
        case dlpack::kDLComplex: return t.bits == 64 || t.bits == 128 ? t.bits / 8 : 0;
        default: return 0;
    }
}

// Elements of a C-contiguous DLTensor (torch's rule: dimensions of extent 1 may have any
// stride); -1 when it is not C-contiguous or an extent is negative.
long long c_contiguous_count(const dlpack::Tensor& t) {
    long long count = 1;
    long long expected = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
        const long long n = t.shape[i];
        if (n < 0) return -1;
        if (n != 1 && t.strides && t.strides[i] != expected) return -1;
        if (n > 0 && count > (1LL << 62) / n) return -1;
        count *= n;
        expected *= n;
    }
    return count;
}

// A torch tensor through Tensor.numpy(), which shares its memory and costs a tenth of
// numpy.from_dlpack (evidence: copy-foreign-array-cost); torch's own errors name what to do
// (a GPU tensor, requires grad, bfloat16, conjugate or negative views).
PyObject* torch_array(PyObject* obj, const std::function<std::string()>& named) {
    PyObject* arr = PyObject_CallMethod(obj, "numpy", nullptr);
    if (arr) return arr;
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    const bool dtype = str_or(v, "error").find("ScalarType") != std::string::npos;
    PyErr_Restore(t, v, tb);
    reraise_with_prefix([&] { return named() + " cannot be read as a numpy array: "; },
                        dtype ? kNoSuchDtypeHint : kNothingCopied);
    return nullptr;
}

}  // namespace

std::string qualified_type_name(PyObject* obj) {
    PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(obj));
    PyObject* module = PyObject_GetAttrString(type, "__module__");
    if (!module) PyErr_Clear();
    std::string name = Py_TYPE(obj)->tp_name;
    if (module && PyUnicode_Check(module)) {
        const char* m = PyUnicode_AsUTF8(module);
        const char* dot = std::strrchr(Py_TYPE(obj)->tp_name, '.');
        if (m && std::string(m) != "builtins") name = std::string(m) + "." + (dot ? dot + 1 : Py_TYPE(obj)->tp_name);
        if (!m) PyErr_Clear();
    }
    Py_XDECREF(module);
    return name;
}

int torch_contiguous_pair(PyObject* dst, PyObject* src, void*& dst_ptr, const void*& src_ptr, std::size_t& nbytes) {
    // The type's name first: a string compare costs less than looking torch up.
    if (std::strcmp(Py_TYPE(dst)->tp_name, "Tensor") != 0) return 0;
    PyTypeObject* tensor = torch_tensor_type();
    if (!tensor || Py_TYPE(dst) != tensor || Py_TYPE(src) != tensor) return 0;
    const TorchFacts* f = torch_facts();
    if (!f) return 0;
    // Each DLTensor is read at once: its shape and strides belong to torch and stay valid only
    // until control returns to it. Tensors without plain storage (sparse, MKL-DNN, nested,
    // functorch wrappers) and dtypes DLPack lacks raise here.
    constexpr int kMaxDims = 64;
    dlpack::Tensor d, s;
    if (f->api->dltensor_from_py_object_no_sync(dst, &d) != 0) {
        PyErr_Clear();
        return 0;
    }
    if (d.device.device_type != dlpack::kDLCPU || d.ndim < 0 || d.ndim > kMaxDims) return 0;
    const std::size_t itemsize = numpy_itemsize(d.dtype);
    const long long count = itemsize ? c_contiguous_count(d) : -1;
    if (count <= 0) return 0;  // an empty copy: the general path's rules
    char* dp = static_cast<char*>(d.data) + d.byte_offset;
    // dst's extents, kept before the next call into torch.
    std::int64_t extents[kMaxDims];
    for (int i = 0; i < d.ndim; ++i) extents[i] = d.shape[i];
    if (f->api->dltensor_from_py_object_no_sync(src, &s) != 0) {
        PyErr_Clear();
        return 0;
    }
    if (s.device.device_type != dlpack::kDLCPU || s.ndim != d.ndim) return 0;
    if (s.dtype.code != d.dtype.code || s.dtype.bits != d.dtype.bits || s.dtype.lanes != d.dtype.lanes) return 0;
    if (c_contiguous_count(s) != count) return 0;
    for (int i = 0; i < d.ndim; ++i)
        if (s.shape[i] != extents[i]) return 0;  // the same shape, not only the same count
    const char* sp = static_cast<const char*>(s.data) + s.byte_offset;
    // What Tensor.numpy() refuses and a DLTensor does not show.
    const bool complex = d.dtype.code == dlpack::kDLComplex;
    for (PyObject* t : {dst, src}) {
        if (!value_is(t, f->requires_grad, Py_False)) return 0;
        if (!value_is(t, f->is_neg, Py_False)) return 0;
        if (complex && !value_is(t, f->is_conj, Py_False)) return 0;
    }
    dst_ptr = dp;
    src_ptr = sp;
    nbytes = static_cast<std::size_t>(count) * itemsize;
    return 1;
}

bool exports_foreign_array(PyObject* obj) {
    if (PyTypeObject* tensor = torch_tensor_type(); tensor && PyObject_TypeCheck(obj, tensor)) return true;
    static PyObject* dlpack = PyUnicode_InternFromString("__dlpack__");
    static PyObject* interface = PyUnicode_InternFromString("__array_interface__");
    if (PyObject_HasAttr(obj, dlpack)) return true;
    return PyObject_HasAttr(obj, interface) != 0;
}

PyObject* foreign_array(PyObject* obj, const std::function<std::string()>& who) {
    static PyObject* dlpack = PyUnicode_InternFromString("__dlpack__");
    static PyObject* device = PyUnicode_InternFromString("__dlpack_device__");
    static PyObject* interface = PyUnicode_InternFromString("__array_interface__");
    auto named = [&] { return who() + " (" + qualified_type_name(obj) + ")"; };
    if (PyTypeObject* tensor = torch_tensor_type(); tensor && PyObject_TypeCheck(obj, tensor))
        return torch_array(obj, named);
    if (PyObject_HasAttr(obj, dlpack)) {
        if (PyObject_HasAttr(obj, device)) {
            PyObject* dev = PyObject_CallMethodNoArgs(obj, device);
            if (!dev) {
                reraise_with_prefix([&] { return named() + ": __dlpack_device__() failed: "; }, "");
                return nullptr;
            }
            long type = -1;
            if (PyTuple_Check(dev) && PyTuple_GET_SIZE(dev) >= 1) type = PyLong_AsLong(PyTuple_GET_ITEM(dev, 0));
            Py_DECREF(dev);
            if (type == -1 && PyErr_Occurred()) PyErr_Clear();
            if (!cpu_readable(type)) {
                const std::string msg = named() + " is in memory of " + device_name(type) + " (DLPack device type " +
                                        std::to_string(type) +
                                        "), not the CPU's: fastcopy copies CPU memory; move it to the CPU first "
                                        "(e.g. tensor.cpu()); nothing was copied";
                PyErr_SetString(PyExc_TypeError, msg.c_str());
                return nullptr;
            }
        }
        PyObject* from_dlpack = numpy_function("from_dlpack");
        if (!from_dlpack) return nullptr;
        PyObject* arr = PyObject_CallOneArg(from_dlpack, obj);
        Py_DECREF(from_dlpack);
        if (!arr) {
            reraise_with_message([&](const std::string& original) {
                const bool dtype = original.find("dtype") != std::string::npos;
                return named() + " cannot be read through DLPack: " + original +
                       (dtype ? kNoSuchDtypeHint : kNothingCopied);
            });
            return nullptr;
        }
        return arr;
    }
    if (PyObject_HasAttr(obj, interface)) {
        PyObject* asarray = numpy_function("asarray");
        if (!asarray) return nullptr;
        PyObject* arr = PyObject_CallOneArg(asarray, obj);
        Py_DECREF(asarray);
        if (!arr)
            reraise_with_prefix([&] { return named() + " cannot be read through __array_interface__: "; },
                                kNothingCopied);
        return arr;
    }
    return nullptr;
}

}  // namespace fastcopy
