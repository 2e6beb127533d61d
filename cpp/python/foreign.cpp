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

// A torch tensor through Tensor.numpy(), which shares its memory and costs a fifth of
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
