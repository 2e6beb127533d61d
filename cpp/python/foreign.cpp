// Arrays of other libraries read as numpy arrays (foreign.h).
#include "python/foreign.h"
#include "python/pyerr.h"

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

// What the direct tensor route needs of torch, looked up once torch.Tensor is known.
struct TorchFacts {
    PyObject* strided = nullptr;                 // torch.strided
    PyObject* dtypes[16] = {};                   // the dtypes Tensor.numpy() accepts
    Py_ssize_t itemsize[16] = {};
    bool complex[16] = {};
    int count = 0;
};

const TorchFacts* torch_facts() {
    static TorchFacts facts;
    static bool tried = false;
    if (tried) return facts.count ? &facts : nullptr;
    PyObject* modules = PyImport_GetModuleDict();  // borrowed
    PyObject* torch = modules ? PyDict_GetItemString(modules, "torch") : nullptr;  // borrowed
    if (!torch) return nullptr;
    tried = true;
    struct Named {
        const char* name;
        Py_ssize_t itemsize;
        bool complex;
    };
    static const Named names[] = {{"bool", 1, false},    {"uint8", 1, false},     {"int8", 1, false},
                                  {"int16", 2, false},   {"int32", 4, false},     {"int64", 8, false},
                                  {"float16", 2, false}, {"float32", 4, false},   {"float64", 8, false},
                                  {"complex64", 8, true}, {"complex128", 16, true}};
    facts.strided = PyObject_GetAttrString(torch, "strided");  // kept for the process
    if (!facts.strided) {
        PyErr_Clear();
        return nullptr;
    }
    for (const Named& n : names) {
        PyObject* dtype = PyObject_GetAttrString(torch, n.name);  // kept for the process
        if (!dtype) {
            PyErr_Clear();
            continue;
        }
        facts.dtypes[facts.count] = dtype;
        facts.itemsize[facts.count] = n.itemsize;
        facts.complex[facts.count] = n.complex;
        ++facts.count;
    }
    return facts.count ? &facts : nullptr;
}

// The value of attribute `name` (a method called with no arguments when `call`) is exactly `want`.
bool attr_is(PyObject* obj, PyObject* name, bool call, PyObject* want) {
    PyObject* v = call ? PyObject_CallMethodNoArgs(obj, name) : PyObject_GetAttr(obj, name);
    if (!v) {
        PyErr_Clear();
        return false;
    }
    const bool same = v == want;
    Py_DECREF(v);
    return same;
}

// One tensor of the pair: the checks that Tensor.numpy() makes, and C-contiguity. Tensors
// without plain storage (sparse, nested, MKL-DNN, functorch wrappers) raise in one of these
// reads or in shape/data_ptr(), and so take the general path.
bool plain_cpu_tensor(PyObject* t, const TorchFacts& f, bool complex) {
    static PyObject* is_cpu = PyUnicode_InternFromString("is_cpu");
    static PyObject* layout = PyUnicode_InternFromString("layout");
    static PyObject* requires_grad = PyUnicode_InternFromString("requires_grad");
    static PyObject* is_contiguous = PyUnicode_InternFromString("is_contiguous");
    static PyObject* is_neg = PyUnicode_InternFromString("is_neg");
    static PyObject* is_conj = PyUnicode_InternFromString("is_conj");
    return attr_is(t, is_cpu, false, Py_True) && attr_is(t, layout, false, f.strided) &&
           attr_is(t, requires_grad, false, Py_False) &&
           attr_is(t, is_contiguous, true, Py_True) && attr_is(t, is_neg, true, Py_False) &&
           (!complex || attr_is(t, is_conj, true, Py_False));
}

// data_ptr() as a pointer; nullptr when it cannot be read.
void* data_pointer(PyObject* t) {
    static PyObject* data_ptr = PyUnicode_InternFromString("data_ptr");
    PyObject* v = PyObject_CallMethodNoArgs(t, data_ptr);
    if (!v) {
        PyErr_Clear();
        return nullptr;
    }
    void* p = PyLong_AsVoidPtr(v);
    Py_DECREF(v);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return nullptr;
    }
    return p;
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
    static PyObject* dtype_name = PyUnicode_InternFromString("dtype");
    static PyObject* shape_name = PyUnicode_InternFromString("shape");
    // The type's name first: a string compare costs less than looking torch up.
    if (std::strcmp(Py_TYPE(dst)->tp_name, "Tensor") != 0) return 0;
    PyTypeObject* tensor = torch_tensor_type();
    if (!tensor || Py_TYPE(dst) != tensor || Py_TYPE(src) != tensor) return 0;
    const TorchFacts* f = torch_facts();
    if (!f) return 0;
    // One dtype object for both (torch's dtypes are singletons), among those numpy has.
    PyObject* dd = PyObject_GetAttr(dst, dtype_name);
    PyObject* sd = dd ? PyObject_GetAttr(src, dtype_name) : nullptr;
    Py_XDECREF(dd);
    Py_XDECREF(sd);  // torch keeps its dtype objects alive: identity stays meaningful
    if (!sd) {
        PyErr_Clear();
        return 0;
    }
    if (dd != sd) return 0;
    int k = 0;
    while (k < f->count && f->dtypes[k] != dd) ++k;
    if (k == f->count) return 0;
    if (!plain_cpu_tensor(dst, *f, f->complex[k]) || !plain_cpu_tensor(src, *f, f->complex[k])) return 0;
    // The same shape (torch.Size is a tuple), and its element count.
    PyObject* ds = PyObject_GetAttr(dst, shape_name);
    PyObject* ss = ds ? PyObject_GetAttr(src, shape_name) : nullptr;
    int same = -1;
    std::size_t count = 1;
    if (ss && PyTuple_Check(ds) && PyTuple_Check(ss)) {
        same = PyObject_RichCompareBool(ds, ss, Py_EQ);
        for (Py_ssize_t i = 0; same == 1 && i < PyTuple_GET_SIZE(ds); ++i) {
            const Py_ssize_t n = PyLong_AsSsize_t(PyTuple_GET_ITEM(ds, i));
            if (n < 0) same = -1;
            else count *= static_cast<std::size_t>(n);
        }
    }
    Py_XDECREF(ds);
    Py_XDECREF(ss);
    if (same != 1) {
        PyErr_Clear();
        return 0;
    }
    nbytes = count * static_cast<std::size_t>(f->itemsize[k]);
    if (nbytes == 0) return 0;  // an empty copy: the general path's rules
    dst_ptr = data_pointer(dst);
    src_ptr = dst_ptr ? data_pointer(src) : nullptr;
    return dst_ptr && src_ptr ? 1 : 0;
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
