// Arrays of other libraries (torch and JAX CPU arrays, pyarrow arrays and tensors, CuPy or
// numba host arrays): objects that export neither a numpy array nor the buffer protocol but
// DLPack (__dlpack__) or __array_interface__. Every entry point that takes an array reads
// such an object through foreign_array(), as a numpy array over the same memory.
#pragma once
#include <Python.h>

#include <cstddef>
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

// True for an object the numpy and buffer paths do not take and that exports a foreign array
// (not None, not a numpy array, no buffer protocol; exports_foreign_array).
bool is_foreign_array(PyObject* obj);

// A numpy drop-in (copyto, stack, concatenate) as a vectorcall function.
using DropInFunction = PyObject* (*)(PyObject*, PyObject* const*, Py_ssize_t, PyObject*);

// `fn` called with the foreign arrays among its arguments read as numpy arrays over their
// memory: dst and src of copyto (join = false), or the items of the arrays sequence and out=
// of stack and concatenate (join = true), which then return the caller's own out= object.
// nullptr with no exception set when no argument is foreign; nullptr with one when a foreign
// array cannot be read (its error names `name` and the argument) or `fn` raised.
PyObject* call_on_numpy_views(DropInFunction fn, const char* name, bool join, PyObject* const* args,
                               Py_ssize_t nargs, PyObject* kwnames);

// A copy between two torch tensors that Tensor.numpy() would read without complaint (CPU,
// strided, no grad, no negative or conjugate bit, a dtype numpy has) and that are both
// C-contiguous, of the same dtype and shape: the direct route, which describes each tensor
// through torch's DLPack exchange table (one C call) and reads requires_grad and the negative
// and conjugate bits through torch's own C descriptors, instead of building two numpy arrays
// (evidence: copy-foreign-array-cost).
// 1: `dst_ptr`, `src_ptr` and `nbytes` are filled; 0: not such a pair, or torch is not
// imported (the general path decides, and raises any error); never raises.
int torch_contiguous_pair(PyObject* dst, PyObject* src, void*& dst_ptr, const void*& src_ptr, std::size_t& nbytes);

// "torch.Tensor": the module-qualified name of obj's type.
std::string qualified_type_name(PyObject* obj);

}  // namespace fastcopy
