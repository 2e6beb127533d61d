// Reading and re-raising Python exceptions: the one implementation the operand resolver and
// the readers of foreign arrays share.
#pragma once
#include <Python.h>

#include <functional>
#include <string>

namespace fastcopy {

// str(o), or `fallback` when o is nullptr or str() fails (that failure is cleared).
std::string str_or(PyObject* o, const char* fallback);

// Clears the pending exception and returns true when it is an ordinary one (an Exception);
// leaves KeyboardInterrupt, SystemExit and other BaseExceptions set and returns false. For the
// calls that can run Python code (__float__, __index__, a __buffer__) whose failure the caller
// turns into its own error or a fallback: a signal handler's KeyboardInterrupt raised in them
// reaches the caller instead of being cleared with the rest.
bool clear_ordinary_error();

// Re-raises the pending exception with the same type (TypeError when none is pending) and the
// text message(str of the original); the original stays as __cause__. `message` runs with no
// exception pending, so it may look attributes up.
void reraise_with_message(const std::function<std::string(const std::string& original)>& message);

}  // namespace fastcopy
