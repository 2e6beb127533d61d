// Every error copy(), copy_region(), a kernel callable and copy_many() report about their
// operands: the kinds, which Python exception each maps to, and the message text, built here
// only. The bindings fill in the Python facts (type names, dtype text) and raise.
#pragma once
#include <cstddef>
#include <string>

#include "core/layout.h"

namespace fastcopy {
namespace core {

enum class CopyError {
    None,
    NotBuffer,       // not an array, a buffer exporter or a DLPack / __array_interface__ exporter
    ReadOnlyArray,   // dst is a numpy array with flags.writeable False
    ReadOnlyBuffer,  // dst exports only a read-only buffer
    ReadOnlyShared,  // dst is memory fastcopy.shm maps read-only (a received view's pages)
    ObjectDtype,     // a numpy dtype holding Python object references
    ObjectFormat,    // a buffer format with 'O' items
    TooManyDims,     // more than kMaxOperandDims dimensions
    ExportFailed,    // the buffer export itself raised (its exception type is kept)
    ShapeMismatch,   // two arrays of different shapes
    DtypeMismatch,   // two arrays of different dtypes
    SizeMismatch,    // other operands with different byte counts
    NativeFailure,   // the copy failed inside the native core
};

// Why a destination in the pages of a received view is refused (read_only_ranges.h): the text
// of every message that refuses one, after the destination's name.
inline constexpr const char* kReadOnlySharedText =
    "is memory fastcopy.shm maps read-only (a message received with recv_view, which other processes read "
    "too): writing it would crash the process; use recv_view(cow=True) for a writable view, or recv(out=...)";

enum class ErrorType { TypeError, ValueError, RuntimeError, Original };
ErrorType error_type(CopyError e);

// Where an error arises: the function ("copy", "copy_region", "kernel", "copy_many") and, for
// copy_many, the pair index (-1 otherwise). copy_many's messages end "; nothing was copied".
struct ErrorSite {
    const char* fn;
    std::ptrdiff_t pair = -1;
};

// The facts a message names; each kind reads the fields it needs.
struct ErrorFacts {
    const char* which = "";      // "dst" or "src"
    std::string dst_text;        // dst's type name, dtype text or shape text
    std::string src_text;        // src's
    std::size_t dst_bytes = 0, src_bytes = 0;
    int ndim = 0;                // TooManyDims
    std::string detail;          // ObjectFormat: the format; ExportFailed: the original message
    bool writable = false;       // NotBuffer: the operand is dst (bytes is not accepted)
};

std::string error_message(const ErrorSite& site, CopyError e, const ErrorFacts& f);

// "(2, 3)", "(4,)", "()".
std::string shape_text(int nd, const std::ptrdiff_t* shape);

// copy()'s pair rules: two arrays need equal shapes, then equal dtypes (`same_dtype`, which
// the caller knows), anything else equal byte counts. None when the pair may be copied.
inline CopyError check_pair(const OperandDesc& d, const OperandDesc& s, bool both_arrays, bool same_dtype) {
    if (both_arrays) {
        bool same = d.ndim == s.ndim;
        for (int i = 0; same && i < d.ndim; ++i) same = d.shape[i] == s.shape[i];
        if (!same) return CopyError::ShapeMismatch;
        return same_dtype ? CopyError::None : CopyError::DtypeMismatch;
    }
    return d.nbytes == s.nbytes ? CopyError::None : CopyError::SizeMismatch;
}

// The facts for check_pair's ShapeMismatch and SizeMismatch (dtype and type names from the caller).
ErrorFacts pair_facts(CopyError e, const OperandDesc& d, const OperandDesc& s, std::string dst_name,
                      std::string src_name);

// True when a PEP 3118 / struct format holds 'O' (Python object) items; field names
// (between colons, e.g. "T{<i:Other:}") are skipped.
bool format_has_objects(const char* fmt);

}  // namespace core
}  // namespace fastcopy
