"""Where tuned dispatch profiles live and which machine they belong to (docs/profile-format.md).

``signature()`` names this machine as far as copy speed goes; ``cache_path()`` is the file
``python -m fastcopy tune`` writes for it and the import loads when the signatures are equal.
Cheap: no py-cpuinfo, no subprocess; facts come from fastcopy's own CPU detection.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from typing import Any, Dict


def signature() -> Dict[str, Any]:
    """The CPU signature: vendor, family, model, stepping, features, cache sizes, CPU count,
    kernel and C library versions, fastcopy version. Equal signatures: a profile applies."""
    from . import __version__, _core

    facts = _core.cpu_facts()
    libc_name, libc_version = platform.libc_ver()
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
        "kernel": platform.release(),
        "libc": f"{libc_name} {libc_version}".strip() or None,
        "fastcopy": __version__,
    }


def cache_dir() -> str:
    """``$XDG_CACHE_HOME/fastcopy``, else ``~/.cache/fastcopy``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fastcopy")


def cache_path() -> str:
    """The tuned profile for this machine: ``cache_dir()/profile-<12 hex digits of the signature's SHA-256>.json``."""
    digest = hashlib.sha256(json.dumps(signature(), sort_keys=True).encode()).hexdigest()[:12]
    return os.path.join(cache_dir(), f"profile-{digest}.json")
