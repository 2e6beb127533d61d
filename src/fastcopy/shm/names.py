"""Segment names this process created: removed at interpreter exit and at a multiprocessing
child's exit; the default name of a new channel or topic."""

from __future__ import annotations

import atexit
import os
import secrets
import sys
from typing import Dict

from .. import _core

# Segments this process created and has not unlinked: removed at interpreter exit (so a
# forgotten unlink() does not leave files in /dev/shm). Only in the creating process, not in
# forked children.
_created: Dict[str, int] = {}


@atexit.register
def _unlink_created_at_exit() -> None:
    pid = os.getpid()
    for name, owner in list(_created.items()):
        if owner == pid:
            _core.shm_unlink(name)
    _created.clear()


_child_cleanup_pid = 0


def _unlink_created_in_multiprocessing_child() -> None:
    """A multiprocessing child (fork, forkserver or spawn; Pool workers too) ends with
    ``os._exit`` after multiprocessing's own finalizers, so atexit never runs there and the
    channels it created stayed in /dev/shm. Register the same cleanup as a multiprocessing
    finalizer (in a plain process it also runs at exit; the second call finds nothing)."""
    global _child_cleanup_pid
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is None or _child_cleanup_pid == os.getpid():
        return
    _child_cleanup_pid = os.getpid()
    mp_util.Finalize(None, _unlink_created_at_exit, exitpriority=0)


def _default_name() -> str:
    return f"fastcopy-{os.getpid()}-{secrets.token_hex(6)}"
