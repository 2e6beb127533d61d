"""Which dispatch profile runs: tuned files, the user cache, and the import-time choice.

``signature()`` names this machine as far as copy speed goes; ``cache_path()`` is the file
``python -m fastcopy tune`` writes for it. At ``import fastcopy``, ``load_at_import()`` picks
the profile (docs/profile-format.md):

- ``FASTCOPY_PROFILE=off``: the built-in profile for this CPU;
- ``FASTCOPY_PROFILE=<path>``: that file (a signature from another machine is reported by
  ``info()``, not refused: sharing profiles is how bugs get reproduced);
- else the cached profile whose signature equals this machine's, if any; cached profiles of
  other signatures are ignored and ``info()`` says so.

A file that cannot be used (unreadable, not a regular file, over 1 MiB, bad JSON, unknown or
unusable kernel, bad bands, absurd thresholds) gives exactly one warning and the built-in
profile. Import cost: a stat or two and, when a profile exists, one read and the C++ parser;
no json, hashlib, subprocess or py-cpuinfo.
"""

from __future__ import annotations

import json
import os
import stat
import warnings
import zlib
from typing import Any, Dict, List, Optional

from . import _core

MAX_PROFILE_BYTES = _core.profile_limits()["max_file_bytes"]

# The variable that chooses the profile at import, as docs/reference/environment.md shows it
# (tools/gen_reference.py reads this).
PROFILE_VARIABLE = {
    "name": "FASTCOPY_PROFILE",
    "values": "a path to a profile file, or off",
    "effect": "the profile to run instead of the cached tuned one for this machine: a file that cannot be used "
              "gives one warning and the built-in profile; off: the built-in profile, ignoring the cache; "
              "a file's signature is reported by info(), not enforced",
    "default": "the cached profile whose signature equals this machine's, else the built-in one",
}

# What load_at_import() decided, for info(): {"source", "path", "detail", "ignored"}.
_status: Dict[str, Any] = {"source": "built-in", "path": None, "detail": "not loaded yet", "ignored": []}


def signature() -> Dict[str, Any]:
    """The CPU signature: vendor, family, model, stepping, features, cache sizes, CPU count,
    kernel and C library versions, fastcopy version. A cached profile applies only when equal."""
    from . import __version__

    facts = _core.cpu_facts()
    try:
        libc: Optional[str] = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.36"; no subprocess
    except (ValueError, OSError, AttributeError):
        libc = None
    return {
        "arch": facts.get("arch"),
        "vendor": facts.get("vendor"),
        "family": facts.get("family"),
        "model": facts.get("model"),
        "stepping": facts.get("stepping"),
        "features": sorted(name for name, present in (facts.get("flags") or {}).items() if present),
        "l1d_bytes": facts.get("l1d_bytes"),
        "l2_bytes": facts.get("l2_bytes"),
        "l3_bytes": facts.get("l3_bytes"),
        "cpus": os.cpu_count(),
        "kernel": os.uname().release if hasattr(os, "uname") else None,
        "libc": libc,
        "fastcopy": __version__,
    }


def _compact(value: Any) -> str:
    """``value`` as compact JSON, written by the profile reader itself (_core.compact_json), so a
    signature member of this machine and one read from a file compare as the same text."""
    return _core.compact_json(json.dumps(value, default=str))


def signature_key(sig: Optional[Dict[str, Any]] = None) -> str:
    """16 hex digits naming a signature (file names only; the file's own signature decides)."""
    text = _compact({k: v for k, v in sorted((sig or signature()).items())}).encode()
    return f"{zlib.crc32(text):08x}{zlib.adler32(text):08x}"


def cache_dir() -> str:
    """``$XDG_CACHE_HOME/fastcopy``, else ``~/.cache/fastcopy``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fastcopy")


def cache_path() -> str:
    """The tuned profile for this machine: ``cache_dir()/profile-<signature_key()>.json``."""
    return os.path.join(cache_dir(), f"profile-{signature_key()}.json")


def signature_differences(profile_text: str, sig: Optional[Dict[str, Any]] = None) -> List[str]:
    """Keys whose values differ between a profile's signature and ``sig`` (this machine's by
    default); ``["signature"]`` when the profile has none. Raises ValueError on bad JSON."""
    theirs = _core.profile_signature(profile_text)
    if not theirs:
        return ["signature"]
    mine = {k: _compact(v) for k, v in (sig or signature()).items()}
    return sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))


class ProfileFileError(ValueError):
    """A profile file that cannot be used; the message names the file and the problem."""


def read_profile_text(path: str) -> str:
    """The text of a profile file, refusing what is not a regular file of at most 1 MiB of UTF-8."""
    try:
        st = os.stat(path)  # follows symlinks; a loop raises ELOOP here
    except OSError as e:
        raise ProfileFileError(f"cannot read {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ProfileFileError(f"{path} is not a regular file")
    if st.st_size > MAX_PROFILE_BYTES:
        raise ProfileFileError(f"{path} is {st.st_size} bytes, more than the 1 MiB limit")
    try:
        # O_NONBLOCK: should the path turn into a FIFO after the stat, open must not hang.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ProfileFileError(f"{path} is not a regular file")
            data = os.read(fd, MAX_PROFILE_BYTES + 1)
        finally:
            os.close(fd)
    except OSError as e:
        raise ProfileFileError(f"cannot read {path}: {e.strerror or e}") from None
    if len(data) > MAX_PROFILE_BYTES:
        raise ProfileFileError(f"{path} is more than the 1 MiB limit")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProfileFileError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def load_file(path: str, source: str) -> None:
    """Validate and activate the profile in ``path``; ProfileFileError/ValueError name the problem."""
    text = read_profile_text(path)
    try:
        _core.load_profile(text, source)
    except ValueError as e:
        raise ProfileFileError(f"{path}: {e}") from None


def _warn(problem: str) -> None:
    warnings.warn(f"fastcopy: {problem}; using the built-in dispatch profile", RuntimeWarning, stacklevel=4)


def _other_cached(mine: str) -> List[str]:
    try:
        names = os.listdir(cache_dir())
    except OSError:
        return []
    return sorted(os.path.join(cache_dir(), n) for n in names
                  if n.startswith("profile-") and n.endswith(".json") and os.path.join(cache_dir(), n) != mine)


def load_at_import() -> None:
    """Choose the profile for this process (see the module docstring). Never raises for a bad
    file: one warning, then the built-in profile."""
    _status.update(source="built-in", path=None, ignored=[])
    # Surrounding whitespace is removed, as for every FASTCOPY_* variable (cpp/policy/overrides.cpp).
    choice = os.environ.get(PROFILE_VARIABLE["name"], "").strip()
    if choice.lower() == "off":
        _core.use_builtin_profile()
        _status["detail"] = "FASTCOPY_PROFILE=off: tuned profiles disabled"
        return
    if choice:
        path = os.path.abspath(choice)
        try:
            load_file(path, path)
        except ValueError as e:
            _core.use_builtin_profile()
            _status["detail"] = f"FASTCOPY_PROFILE={choice} could not be used: {e}"
            _warn(f"FASTCOPY_PROFILE: {e}")
            return
        _status.update(source="file", path=path, detail=f"FASTCOPY_PROFILE={choice}")
        return
    path = cache_path()
    if not os.path.lexists(path):
        _core.use_builtin_profile()
        _status["ignored"] = _other_cached(path)
        _status["detail"] = ("no tuned profile for this machine (python -m fastcopy tune writes one)"
                             if not _status["ignored"] else
                             "no tuned profile for this machine; cached profiles of other machines ignored")
        return
    try:
        text = read_profile_text(path)
        differs = signature_differences(text)
    except ValueError as e:
        _core.use_builtin_profile()
        _status["detail"] = f"cached profile {path} could not be used: {e}"
        _warn(f"cached profile {e}" if str(e).startswith(path) else f"cached profile {path}: {e}")
        return
    if differs:
        _core.use_builtin_profile()
        _status["ignored"] = [path]
        _status["detail"] = (f"cached profile {path} ignored: measured on another machine "
                             f"(signature differs in {', '.join(differs)})")
        return
    try:
        _core.load_profile(text, path)
    except ValueError as e:
        _core.use_builtin_profile()
        _status["detail"] = f"cached profile {path} could not be used: {e}"
        _warn(f"cached profile {path}: {e}")
        return
    _status.update(source="cache", path=path, detail="tuned profile from the cache (signature matches)")


def status() -> Dict[str, Any]:
    """What load_at_import() decided: source ("built-in", "file", "cache"), path, detail, ignored files."""
    return dict(_status, ignored=list(_status["ignored"]))
