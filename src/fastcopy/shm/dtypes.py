"""The dtype wire text of fastcopy.shm: how a numpy dtype travels in a message header."""

from __future__ import annotations

import ast
import math
from typing import Any, Dict, List, Tuple

import numpy as np

# How a dtype travels in a message header (whose layout and limits, a dtype text of printable
# ASCII among them, cpp/shm/wire.h defines): ``dtype.str`` for a plain dtype, else ``'lit:'``
# and the ascii() text of a Python literal, which escapes every character outside ASCII in
# field names, titles and metadata (ast.literal_eval gives them back exactly):
#   ["sub", base, shape]                                           a sub-array dtype
#   ["struct", names, formats, offsets, itemsize, aligned]         a structure
#   ["struct", names, formats, offsets, itemsize, aligned, titles] one with titles (None: untitled)
#   ["record", struct]                                             a structure of type np.record
#   ["meta", dtype, metadata]                                      a dtype with metadata (a dict)
# A dtype whose description does not come back exactly from its text is refused by send and
# loan (TypeError): a receiver never gets a dtype other than the one sent.
_LITERAL_ATOMS = (str, bytes, int, bool, type(None))


def _is_literal(obj: Any, depth: int = 0) -> bool:
    """Whether ast.literal_eval(ascii(obj)) gives obj back: str, bytes, int, bool, None,
    finite floats and complex numbers, and lists, tuples, non-empty sets and dicts of them."""
    kind = type(obj)
    if depth > 32:
        return False
    if kind in _LITERAL_ATOMS:
        return True
    if kind is float:
        return math.isfinite(obj)
    if kind is complex:
        return math.isfinite(obj.real) and math.isfinite(obj.imag)
    if kind in (list, tuple) or (kind is set and obj):
        return all(_is_literal(x, depth + 1) for x in obj)
    if kind is dict:
        return all(_is_literal(k, depth + 1) and _is_literal(v, depth + 1) for k, v in obj.items())
    return False


def _short_repr(obj: Any) -> str:
    try:
        text = repr(obj)
    except Exception:
        text = f"<{type(obj).__name__}>"
    return text if len(text) <= 120 else text[:117] + "..."


def _encode_dtype(dtype: np.dtype, what: str, kinds: List[Any]) -> Any:
    """The literal that describes dtype (see above); appends to ``kinds`` what the literal does
    not name of each part: its DType class, scalar type and flags."""
    kinds.append((type(dtype), dtype.type, dtype.flags))
    if dtype.subdtype is not None:
        base, shape = dtype.subdtype
        enc: Any = ["sub", _encode_dtype(base, what, kinds), list(shape)]
    elif dtype.fields is not None:
        names = list(dtype.names or ())
        fields = [dtype.fields[n] for n in names]
        enc = ["struct", names, [_encode_dtype(f[0], what, kinds) for f in fields], [f[1] for f in fields],
               dtype.itemsize, bool(dtype.isalignedstruct)]
        titles = [f[2] if len(f) > 2 else None for f in fields]
        for name, title in zip(names, titles):
            if not _is_literal(title):
                raise TypeError(f"{what}: dtype {dtype} cannot be sent: the title {_short_repr(title)} of field "
                                f"{name!r} is not a Python literal (str, bytes, numbers, bool, None)")
        if any(t is not None for t in titles):
            enc.append(titles)
        if dtype.type is np.record:
            enc = ["record", enc]
    else:
        enc = dtype.str
        if np.dtype(enc).type is not dtype.type:
            # A type that shares its layout with another: np.longlong is '<i8' as np.int64 is
            # (on Linux), and only its character code names it.
            enc = enc[0] + dtype.char
    if dtype.metadata is not None:
        meta = dict(dtype.metadata)
        if not _is_literal(meta):
            raise TypeError(f"{what}: dtype {dtype} cannot be sent: its metadata {_short_repr(meta)} is not made "
                            "of Python literals (str, bytes, int, finite float and complex, bool, None, and "
                            "lists, tuples, non-empty sets and dicts of them)")
        enc = ["meta", enc, meta]
    return enc


def _decode_dtype(obj: Any) -> np.dtype:
    if isinstance(obj, str):
        return np.dtype(obj)
    tag = obj[0] if isinstance(obj, list) and obj else None
    if tag == "sub" and len(obj) == 3:
        shape = obj[2]
        if not (isinstance(shape, list) and all(isinstance(d, int) and 0 <= d < 2**31 for d in shape)):
            raise ValueError("bad sub-array shape")
        return np.dtype((_decode_dtype(obj[1]), tuple(shape)))
    if tag == "struct" and len(obj) in (6, 7):
        _, names, formats, offsets, itemsize, aligned = obj[:6]
        titles = obj[6] if len(obj) == 7 else None
        if not (isinstance(names, list) and isinstance(formats, list) and isinstance(offsets, list)
                and len(names) == len(formats) == len(offsets) and all(isinstance(n, str) for n in names)
                and all(isinstance(o, int) and 0 <= o < 2**31 for o in offsets)
                and isinstance(itemsize, int) and 0 <= itemsize < 2**31 and isinstance(aligned, bool)
                and (titles is None or (isinstance(titles, list) and len(titles) == len(names)))):
            raise ValueError("bad structured dtype")
        spec: Any = {"names": names, "formats": [_decode_dtype(f) for f in formats], "offsets": offsets,
                     "itemsize": itemsize}
        if titles is not None:
            spec["titles"] = titles
        return np.dtype(spec, align=aligned)
    if tag == "record" and len(obj) == 2:
        inner = _decode_dtype(obj[1])
        if inner.fields is None:
            raise ValueError("bad record dtype")
        return np.dtype((np.record, inner))
    if tag == "meta" and len(obj) == 3 and isinstance(obj[2], dict):
        return np.dtype(_decode_dtype(obj[1]), metadata=obj[2])
    raise ValueError("bad dtype description")


def _same_dtype(a: np.dtype, b: np.dtype) -> bool:
    """a and b alike in every respect, recursively: ``==`` ignores metadata and the scalar type."""
    if (type(a), a.type, a.str, a.itemsize, a.alignment, a.flags, a.isalignedstruct) != (
            type(b), b.type, b.str, b.itemsize, b.alignment, b.flags, b.isalignedstruct):
        return False
    ma, mb = a.metadata, b.metadata
    if (ma is None) != (mb is None) or (ma is not None and mb is not None and dict(ma) != dict(mb)):
        return False
    sa, sb = a.subdtype, b.subdtype
    if (sa is None) != (sb is None) or (a.names is None) != (b.names is None):
        return False
    if sa is not None and sb is not None and (sa[1] != sb[1] or not _same_dtype(sa[0], sb[0])):
        return False
    fields_a, fields_b = a.fields, b.fields
    if a.names is not None and fields_a is not None and fields_b is not None:
        if a.names != b.names:
            return False
        for n in a.names:
            fa, fb = fields_a[n], fields_b[n]
            if fa[1:] != fb[1:] or not _same_dtype(fa[0], fb[0]):
                return False
    return True


# (text, kinds) of the dtypes whose text gave them back exactly. The check decodes the text:
# done at every send of a structure whose dtype object the Channel had not seen (its cache
# keeps 64), a send + recv took 22-25 us against 4 us without the check, and 4.2 us with this
# record (200 distinct dtype objects, 2-vCPU Xeon VM). Two dtypes with the same text and kinds
# decode alike, so one check answers for both.
_carried: Dict[Tuple[str, Tuple[Any, ...]], None] = {}


def _dtype_to_wire(dtype: np.dtype, what: str = "send") -> str:
    """dtype -> the text carried in message headers (see above). TypeError, naming ``what``,
    for a dtype the text cannot describe exactly."""
    if dtype.hasobject:
        raise TypeError(f"{what}: arrays of dtype {dtype} hold Python object pointers, which cannot cross processes")
    kinds: List[Any] = []
    enc = _encode_dtype(dtype, what, kinds)
    wire = enc if isinstance(enc, str) else "lit:" + ascii(enc)
    key = (wire, tuple(kinds))
    if key in _carried:
        return wire
    try:
        same = _same_dtype(_dtype_from_wire(wire), dtype)
    except Exception:
        same = False
    if not same:
        raise TypeError(f"{what}: dtype {_short_repr(dtype)} cannot be sent: a message header cannot describe it "
                        "exactly (its scalar type is not numpy's own, or a part of it does not come back "
                        "from its description)")
    if len(_carried) >= 4096:
        _carried.clear()
    _carried[key] = None
    return wire


def _dtype_from_wire(wire: str) -> np.dtype:
    """Inverse of _dtype_to_wire for untrusted input: only literals are parsed, and anything
    unexpected raises (the channel then reports ChannelCorrupted)."""
    if wire.startswith("lit:"):
        dt = _decode_dtype(ast.literal_eval(wire[4:]))
    else:
        if len(wire) > 64:
            raise ValueError("dtype string too long")
        dt = np.dtype(wire)
    if dt.hasobject:
        raise ValueError("object dtype in a message")
    return dt
