// Reading and re-raising Python exceptions: the one implementation the operand resolver and
// the readers of foreign arrays share.
#pragma once
#include <Python.h>

#include <functional>
#include <string>

namespace fastcopy {

// str(o), or `fallback` when o is nullptr or str() fails (that failure is cleared).
std::string str_or(PyObject* o, const char* fallback);

// Re-raises the pending exception with the same type (TypeError when none is pending) and the
// text message(str of the original); the original stays as __cause__. `message` runs with no
// exception pending, so it may look attributes up.
void reraise_with_message(const std::function<std::string(const std::string& original)>& message);

}  // namespace fastcopy
