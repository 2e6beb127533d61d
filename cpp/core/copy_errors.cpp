// The errors of copy() and copy_many() (copy_errors.h).
#include "core/copy_errors.h"

#include <cstring>

namespace fastcopy {
namespace core {

ErrorType error_type(CopyError e) {
    switch (e) {
        case CopyError::NotBuffer:
        case CopyError::ObjectDtype:
        case CopyError::ObjectFormat:
        case CopyError::DtypeMismatch: return ErrorType::TypeError;
        case CopyError::ReadOnlyArray:
        case CopyError::ReadOnlyBuffer:
        case CopyError::ReadOnlyShared:
        case CopyError::TooManyDims:
        case CopyError::ShapeMismatch:
        case CopyError::SizeMismatch: return ErrorType::ValueError;
        case CopyError::ExportFailed: return ErrorType::Original;
        case CopyError::None:
        case CopyError::NativeFailure: break;
    }
    return ErrorType::RuntimeError;
}

std::string shape_text(int nd, const std::ptrdiff_t* shape) {
    std::string s = "(";
    for (int i = 0; i < nd; ++i) {
        if (i) s += ", ";
        s += std::to_string(static_cast<long long>(shape[i]));
    }
    if (nd == 1) s += ",";
    return s + ")";
}

std::string error_message(const ErrorSite& site, CopyError e, const ErrorFacts& f) {
    std::string m = std::string("fastcopy.") + site.fn + ": ";
    if (site.pair >= 0) m += "pair " + std::to_string(static_cast<long long>(site.pair)) + ": ";
    const std::string which = f.which;
    bool says_nothing_copied = false;
    switch (e) {
        case CopyError::NotBuffer:
            m += which + " must be an array or a buffer: a numpy array, an object exporting the buffer protocol "
                         "(bytearray, memoryview, array.array, mmap, SharedMemory.buf" +
                 (f.writable ? "" : ", bytes") + ") or a CPU array exporting DLPack or __array_interface__ (torch, JAX, "
                 "pyarrow), got " + f.dst_text;
            break;
        case CopyError::ReadOnlyArray:
            m += "dst is a read-only array (flags.writeable is False); nothing was copied";
            says_nothing_copied = true;
            break;
        case CopyError::ReadOnlyBuffer:
            m += "dst (" + f.dst_text + ") is read-only; nothing was copied";
            says_nothing_copied = true;
            break;
        case CopyError::ReadOnlyShared:
            m += "dst (" + f.dst_text + ") " + kReadOnlySharedText + "; nothing was copied";
            says_nothing_copied = true;
            break;
        case CopyError::ObjectDtype:
            m += which + " has dtype " + f.dst_text +
                 ", which holds Python object references and cannot be copied as bytes; use np.copyto(dst, src)";
            break;
        case CopyError::ObjectFormat:
            m += which + " holds Python object references (buffer format '" + f.detail +
                 "') and cannot be copied as bytes";
            break;
        case CopyError::TooManyDims:
            m += which + " has " + std::to_string(f.ndim) + " dimensions; at most " +
                 std::to_string(kMaxOperandDims) + " are supported";
            break;
        case CopyError::ExportFailed:
            m += which + ": " + f.detail;
            break;
        case CopyError::ShapeMismatch:
            m += "shape mismatch: dst has shape " + f.dst_text + " but src has shape " + f.src_text +
                 "; fastcopy does not broadcast, use np.copyto(dst, src) for that";
            break;
        case CopyError::DtypeMismatch:
            m += "dtype mismatch: dst has dtype " + f.dst_text + " but src has dtype " + f.src_text +
                 "; fastcopy does not cast, use np.copyto(dst, src, casting=...) for that";
            break;
        case CopyError::SizeMismatch:
            m += "size mismatch: dst (" + f.dst_text + ") has " + std::to_string(f.dst_bytes) + " bytes but src (" +
                 f.src_text + ") has " + std::to_string(f.src_bytes) + " bytes; byte counts must be equal";
            break;
        case CopyError::None:
        case CopyError::NativeFailure:
            m += "the copy failed inside the native core";
            break;
    }
    if (site.pair >= 0 && !says_nothing_copied) m += "; nothing was copied";
    return m;
}

ErrorFacts pair_facts(CopyError e, const OperandDesc& d, const OperandDesc& s, std::string dst_name,
                      std::string src_name) {
    ErrorFacts f;
    if (e == CopyError::ShapeMismatch) {
        f.dst_text = shape_text(d.ndim, d.shape);
        f.src_text = shape_text(s.ndim, s.shape);
    } else {
        f.dst_text = std::move(dst_name);
        f.src_text = std::move(src_name);
    }
    f.dst_bytes = d.nbytes;
    f.src_bytes = s.nbytes;
    return f;
}

bool format_has_objects(const char* fmt) {
    if (!fmt) return false;
    bool in_name = false;
    for (const char* c = fmt; *c; ++c) {
        if (*c == ':') in_name = !in_name;
        else if (!in_name && *c == 'O') return true;
    }
    return false;
}

}  // namespace core
}  // namespace fastcopy
