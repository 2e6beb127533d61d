// Arrays of other libraries (torch and JAX CPU arrays, pyarrow arrays and tensors, CuPy or
// numba host arrays): objects that export neither a numpy array nor the buffer protocol but
// DLPack (__dlpack__) or __array_interface__. Every entry point that takes an array reads
// such an object through foreign_array(), as a numpy array over the same memory.
#pragma once
#include <Python.h>

#include <functional>
#include <string>

namespace fastcopy {

// True when `obj` has __dlpack__ or __array_interface__ (one attribute lookup each; callers
// ask only after the numpy and buffer paths did not apply).
bool exports_foreign_array(PyObject* obj);

// A numpy array over obj's memory (numpy.from_dlpack, or numpy.asarray for
// __array_interface__; either keeps the producer alive), as a new reference. nullptr with no
// exception set when obj exports neither. nullptr with an exception naming `who()` (e.g.
// "fastcopy.copy: dst", built only then) and obj's type when the memory is not the CPU's (TypeError: a GPU
// tensor), or when the producer refuses the export (its own exception type, the original as
// __cause__: a torch tensor that requires grad, a dtype numpy lacks such as bfloat16).
PyObject* foreign_array(PyObject* obj, const std::function<std::string()>& who);
inline PyObject* foreign_array(PyObject* obj, const std::string& who) {
    return foreign_array(obj, [&who] { return who; });
}

// "torch.Tensor": the module-qualified name of obj's type.
std::string qualified_type_name(PyObject* obj);

}  // namespace fastcopy
