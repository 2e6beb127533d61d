"""fastcopy: the fastest correct memory copy for Python buffers on this CPU.

``fastcopy.copy(dst, src)`` copies any buffer (numpy arrays, bytearray, memoryview, mmap,
shared memory) into another, like ``np.copyto`` for equal shapes and dtypes, with a kernel
chosen for this CPU, size and addresses. ``fastcopy.info()`` says what was detected and
chosen. The choice follows a dispatch profile: the built-in one for this CPU family, or one
measured on this machine by ``python -m fastcopy tune`` (``FASTCOPY_PROFILE=path|off``);
``FASTCOPY_KERNEL``, ``FASTCOPY_REP_MOVSB``, ``FASTCOPY_NT_THRESHOLD`` and ``FASTCOPY_THREADS``
override it (see docs/dispatch.md). ``fastcopy.copyto``, ``stack`` and ``concatenate`` are
drop-ins for numpy's functions (numpy serves what fastcopy's fast path does not); ``copy_many``
copies many pairs in one call.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List

from . import _core

__version__ = "0.1.0"

__all__ = ["copy", "copyto", "stack", "concatenate", "copy_many", "kernels", "kernel", "info", "set_threads",
           "get_threads", "tune", "check_dispatch", "shm", "__version__"]


def _check_environment_encoding() -> None:
    """ImportError naming a FASTCOPY_* variable whose name or value is not UTF-8 (the policy
    reads them as text; without this the error said only "'utf-8' codec can't decode")."""
    import os

    environb = getattr(os, "environb", None)
    if environb is None:  # pragma: no cover - Windows has no bytes environment
        return
    for key, value in environb.items():
        if not key.startswith(b"FASTCOPY_"):
            continue
        try:
            key.decode("utf-8")
            value.decode("utf-8")
        except UnicodeDecodeError:
            shown = key.decode("utf-8", errors="backslashreplace")
            raise ImportError(f"fastcopy: environment variable {shown} is not valid UTF-8 ({value!r}); "
                              f"set it to a text value or unset it") from None


_check_environment_encoding()

try:
    _core.init_policy()
except ValueError as _error:  # a bad FASTCOPY_* value: refuse to start with a clear message
    raise ImportError(f"fastcopy: {_error}") from None

from . import _profile  # noqa: E402  (after init_policy: the overrides apply on top of the profile)

_profile.load_at_import()

copy = _core.copy
# numpy drop-ins and batched copies (cpp/python/bindings_batch.cpp); numpy serves what they do not.
copyto = _core.copyto
stack = _core.stack
concatenate = _core.concatenate
copy_many = _core.copy_many


def kernels() -> List[str]:
    """Names of the kernels usable on this CPU, in the registry's order, e.g. ``['generic', 'avx2', 'avx2_nt', 'erms']``."""
    return [k["name"] for k in _core.kernel_table() if k["supported"]]


def kernel(name: str, threads: int = 1) -> Callable[[Any, Any], None]:
    """A callable ``f(dst, src)`` with the contract of :func:`copy` that always uses kernel ``name``.

    For benchmarks, tests and ``tune``. With ``threads`` > 1 every non-overlapping copy is split
    over the thread pool on that many threads (the caller included; the pool cuts chunks of at
    least 16 KiB, so small copies stay on the caller); 1, the default, never uses the pool.
    Raises ValueError naming the valid kernels when ``name`` is not usable on this CPU, or when
    ``threads`` is not 1 to 1024; TypeError when ``threads`` is not an int (``True`` included).
    """
    if not isinstance(name, str):
        raise TypeError(f"fastcopy.kernel: name must be a str (one of {kernels()}), got {type(name).__name__}")
    if isinstance(threads, bool) or not hasattr(type(threads), "__index__"):
        raise TypeError(f"fastcopy.kernel: threads must be an int (1 to 1024), got {type(threads).__name__}")
    threads = threads.__index__()
    if not 1 <= threads <= 1024:  # checked here too: beyond a C long, pybind11 would only say "incompatible"
        raise ValueError(f"fastcopy.kernel: threads must be 1 to 1024, got {threads}")
    return _core.kernel_callable(name, threads)


def info() -> Dict[str, Any]:
    """What fastcopy detected and decided, as a dict.

    Keys: ``version``; ``cpu`` (detected facts: arch, vendor, family/model, flags, cache
    sizes, SVE vector length, kernel version; ``brand`` from py-cpuinfo when installed);
    ``kernels`` (every compiled kernel: name, description, supported, why_not, streaming,
    twin);
    ``profile`` (the active dispatch profile as it runs: per region and address class the size
    bands with kernel and reason, NT and parallel rules, provenance, overrides applied);
    ``profile_source`` (built-in and why it matched, or the tuned file; ignored cached files);
    ``policy`` (the same bands as flat rows: region, class, min/max bytes, kernel, reason); ``notes``;
    ``thresholds`` (non-temporal and parallel, with reasons); ``threads`` (count, default,
    reason, and ``pool``: this process's counts of copies split over threads, copies done
    alone because the pool was busy, backing off after late workers, or isolated while the
    workers slept, chunks the workers copied, and times a worker went to sleep;
    ``isolated_copies``: that last rule, with its thresholds and reason; ``worker_spin``:
    how long idle workers spin before sleeping, within a stream of copies and after an isolated
    one, with its reason); ``overrides``;
    ``shm`` (the size and time rules of ``fastcopy.shm``'s Channel and Topic: name, value,
    unit, what the rule does, and why); ``evidence`` (every measurement the reasons above cite,
    by id: claim, figures, machine, date and command, from docs/evidence/).
    """
    from ._report import collect_info

    return collect_info()


def set_threads(n: int) -> None:
    """Threads used for large copies: 1 disables threading, 0 restores the default."""
    if isinstance(n, bool) or not hasattr(type(n), "__index__"):
        raise TypeError(f"fastcopy.set_threads: n must be an int (0 for the default, 1 to 1024), "
                        f"got {type(n).__name__}")
    n = n.__index__()
    if not 0 <= n <= 1024:  # checked here too: beyond a C long, pybind11 would only say "incompatible"
        raise ValueError(f"set_threads(n): n must be 0 (default) or 1 to 1024, got {n}")
    _core.set_threads(n)


def get_threads() -> int:
    """Threads a large copy uses now (the calling thread included)."""
    return _core.threads()


def tune(*args: Any, **kwargs: Any) -> Dict[str, Any]:
    """Measure this machine and write a dispatch profile (``python -m fastcopy tune``).

    Keywords as ``fastcopy.tune.profile.tune``: ``quick``, ``output`` (a path; default the user
    cache, see ``fastcopy.tune.profile.default_output``), ``grid``, ``progress``, ``write``.
    Returns the profile as a dict (docs/profile-format.md). The measurement code is imported
    only when this is called (the package ``fastcopy.tune`` then takes this name, and is
    callable the same way).
    """
    from .tune.profile import tune as _tune

    return _tune(*args, **kwargs)


def check_dispatch(*args: Any, **kwargs: Any) -> Dict[str, Any]:
    """Measure the active dispatch profile against every kernel forced and ``np.copyto`` at random
    sizes and offsets (``python -m fastcopy tune --check``). Keywords as
    ``fastcopy.tune.check.check_dispatch``: ``points``, ``seed``, ``repeats``, ``min_time``,
    ``min_size``, ``max_size``, ``confidence``, ``progress``, ``cold`` (one copy per sample with
    neither buffer cached, sizes from 1 MiB). Returns the points, the summary and the printable
    ``report``."""
    from .tune.check import check_dispatch as run

    return run(*args, **kwargs)


def __dir__() -> List[str]:
    # dir() and tab completion list the public API, not the typing names imported above.
    return sorted(__all__)


def __getattr__(name: str) -> Any:
    # fastcopy.shm is imported on first use, so `import fastcopy` stays cheap.
    if name == "shm":
        import importlib

        return importlib.import_module(".shm", __name__)
    raise AttributeError(f"module 'fastcopy' has no attribute {name!r}")
