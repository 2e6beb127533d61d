"""fastcopy.torch: a torch ``Dataset`` run by worker processes that collate each batch
straight into shared memory (:class:`Loader`). Imported only when asked for:
``import fastcopy`` never imports torch."""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("fastcopy.torch needs torch, which is not installed: pip install 'fastcopy[torch]' "
                      f"(or pip install torch) ({e})") from e

from ._loader import SEGMENT_PREFIX, Loader, WorkerError

__all__ = ["Loader", "WorkerError", "SEGMENT_PREFIX"]
