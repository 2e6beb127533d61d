"""Finding and removing stale segments (``python -m fastcopy shm --list`` / ``--clean``).

Segments are recognised by their header, read through the layout the C++ headers define
(``_core.shm_layout()``), whatever their name. Only regular files are opened: /dev/shm is
writable by every user, and a FIFO, a device or a symbolic link there must not block or
redirect the listing.
"""

from __future__ import annotations

import os
import stat
import struct
from typing import Any, Dict, List, Optional, Tuple

from .. import _core

_SEGMENT_DIR = "/dev/shm"
_LAYOUT = _core.shm_layout()
_CHANNEL = _LAYOUT["channel"]
_TOPIC = _LAYOUT["topic"]
_CREATING_PREFIX = _LAYOUT["creating_prefix"]
# The header words are unsigned integers in the machine's byte order.
_WORD_FORMATS = {4: "=I", 8: "=Q"}


def _word(buf: bytes, fields: Dict[str, Tuple[int, int]], name: str, base: int = 0) -> int:
    """The header word ``name`` (an entry of a layout's fields) of ``buf``, ``base`` bytes in."""
    offset, size = fields[name]
    return int(struct.unpack_from(_WORD_FORMATS[size], buf, base + offset)[0])


def _read_regular(path: str, length: int, offset: int = 0) -> Optional[Tuple[bytes, int]]:
    """(up to ``length`` bytes at ``offset``, file size) of ``path`` when it is a regular file
    this process may read; None for anything else. O_NOFOLLOW: a symbolic link is not followed;
    O_NONBLOCK: opening a FIFO does not wait for a writer (it is then refused by the fstat)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        return os.pread(fd, length, offset), st.st_size
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_header(path: str) -> Optional[Dict[str, Any]]:
    """The header fields of a channel or topic segment, or None when ``path`` is not one (not a
    regular file, unreadable, or without a channel's or topic's magic number)."""
    header_bytes = max(_CHANNEL["header_bytes"], _TOPIC["header_bytes"])
    got = _read_regular(path, header_bytes)
    if got is None:
        return None
    head, size = got
    if len(head) < header_bytes:
        return None
    magic = _word(head, _CHANNEL["fields"], "magic")
    if magic == _TOPIC["magic"]:
        f = _TOPIC["fields"]
        # A topic: the publisher is the producer; subscribers are in the records after the
        # header, listed as consumers.
        subs = []
        record, rf = _TOPIC["record_bytes"], _TOPIC["record_fields"]
        states = _TOPIC["record_states"]
        max_subs = min(_word(head, f, "max_subscribers"), _TOPIC["max_subscribers"])
        table = _read_regular(path, record * max_subs, _TOPIC["header_bytes"])
        table_bytes = table[0] if table is not None else b""
        for i in range(len(table_bytes) // record):
            if _word(table_bytes, rf, "state", record * i) in (states["active"], states["pins_only"]):
                subs.append((_word(table_bytes, rf, "pid", record * i), _word(table_bytes, rf, "start", record * i),
                             False))
        return {
            "kind": "topic", "version": _word(head, f, "version"),
            "capacity": _word(head, f, "slot_bytes") * _word(head, f, "slots"), "bytes": size,
            "creator": (_word(head, f, "creator_pid"), _word(head, f, "creator_start")),
            "producer": (_word(head, f, "publisher_pid"), _word(head, f, "publisher_start"),
                         _word(head, f, "publisher_closed") != 0),
            "consumers": subs,
        }
    if magic != _CHANNEL["magic"]:
        return None
    f = _CHANNEL["fields"]
    consumer = (_word(head, f, "consumer_pid"), _word(head, f, "consumer_start"), _word(head, f, "consumer_closed") != 0)
    return {
        "kind": "channel", "version": _word(head, f, "version"), "capacity": _word(head, f, "capacity"), "bytes": size,
        "creator": (_word(head, f, "creator_pid"), _word(head, f, "creator_start")),
        "producer": (_word(head, f, "producer_pid"), _word(head, f, "producer_start"),
                     _word(head, f, "producer_closed") != 0),
        "consumer": consumer,
        "consumers": [consumer],
    }


def _creator_of_unfinished(name: str) -> int:
    """The pid in a segment's name while it is made ("<creating_prefix><pid>-<n>"); 0 for any
    other name."""
    if not name.startswith(_CREATING_PREFIX):
        return 0
    pid, sep, n = name[len(_CREATING_PREFIX):].partition("-")
    return int(pid) if pid.isdigit() and sep and n.isdigit() and 0 < int(pid) < 1 << 32 else 0


def _unfinished(name: str, directory: str) -> Optional[Dict[str, Any]]:
    """A segment whose creator was killed while making it (a regular file under the name a
    segment has before it is linked to its own), or None. Stale once that pid is gone; it never
    had a producer or a consumer."""
    pid = _creator_of_unfinished(name)
    if not pid:
        return None
    got = _read_regular(os.path.join(directory, name), 0)
    if got is None:
        return None
    alive = _core.shm_process_alive(pid)
    return {"name": name, "kind": "unfinished", "bytes": got[1], "capacity": 0, "creator_pid": pid,
            "creator_alive": alive, "producer_pid": 0, "consumer_pid": 0, "subscriber_pids": [],
            "ends_alive": False, "stale": not alive}


def list_segments(prefix: str = "", directory: str = _SEGMENT_DIR) -> List[Dict[str, Any]]:
    """Every fastcopy channel or topic segment in /dev/shm (found by its header, whatever its name)
    whose name starts with ``prefix``.

    Each entry: ``name``, ``kind`` (``"channel"``, ``"topic"``, or ``"unfinished"``: a segment
    whose creator was killed while making it, under the name it has until then), ``bytes``, ``capacity``
    (a topic: slots x slot_bytes), ``creator_pid`` (0: not recorded, made by an older
    fastcopy), ``creator_alive``, ``producer_pid``/``consumer_pid`` (0: none yet; a topic's
    publisher and first subscriber), ``subscriber_pids`` (a topic's subscriber records),
    ``ends_alive`` (a producer, publisher, consumer or subscriber that has not closed is
    running) and ``stale``: the
    creator is recorded and gone and no end is running, so nobody can still use the name
    (processes that have the channel open keep working even when the name is removed).
    """
    out: List[Dict[str, Any]] = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return out
    for name in names:
        if not name.startswith(prefix):
            continue
        unfinished = _unfinished(name, directory)
        if unfinished is not None:
            out.append(unfinished)
            continue
        header = _read_header(os.path.join(directory, name))
        if header is None:
            continue
        creator_pid, creator_start = header["creator"]
        creator_alive = creator_pid != 0 and _core.shm_process_alive(creator_pid, creator_start)
        ends_alive = any(pid != 0 and not closed and _core.shm_process_alive(pid, start)
                         for pid, start, closed in [header["producer"], *header["consumers"]])
        consumers = header["consumers"]
        out.append({
            "name": name, "kind": header["kind"], "bytes": header["bytes"], "capacity": header["capacity"],
            "creator_pid": creator_pid, "creator_alive": creator_alive,
            "producer_pid": header["producer"][0], "consumer_pid": consumers[0][0] if consumers else 0,
            "subscriber_pids": [pid for pid, _, _ in consumers] if header["kind"] == "topic" else [],
            "ends_alive": ends_alive,
            "stale": creator_pid != 0 and not creator_alive and not ends_alive,
        })
    return out


def clean_segments(prefix: str = "", directory: str = _SEGMENT_DIR) -> List[str]:
    """Removes the stale segments of :func:`list_segments` (creator gone, no end running) whose
    name starts with ``prefix`` and returns their names. Segments of running processes, and
    segments without a recorded creator, are left alone."""
    removed: List[str] = []
    for seg in list_segments(prefix, directory):
        if not seg["stale"]:
            continue
        path = os.path.join(directory, seg["name"])
        if seg["kind"] != "unfinished":
            header = _read_header(path)  # re-check: the name may have been reused meanwhile
            if header is None or header["creator"][0] != seg["creator_pid"]:
                continue
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        removed.append(seg["name"])
    return removed
