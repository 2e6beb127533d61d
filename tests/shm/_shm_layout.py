"""The segment layout as the C++ headers define it (``_core.shm_layout()``), for the tests that
read or patch segment headers: every offset, size and magic number comes from there."""

from __future__ import annotations

import struct
from typing import Any, Dict, Tuple

from fastcopy import _core

LAYOUT: Dict[str, Any] = _core.shm_layout()
CHANNEL: Dict[str, Any] = LAYOUT["channel"]
MESSAGE: Dict[str, Any] = LAYOUT["message"]
TOPIC: Dict[str, Any] = LAYOUT["topic"]
PAGE: int = LAYOUT["page_bytes"]

# Header words are unsigned integers in the machine's byte order.
_FORMATS = {1: "=B", 2: "=H", 4: "=I", 8: "=Q"}


def at(part: Dict[str, Any], name: str, table: str = "fields") -> Tuple[int, str]:
    """(offset, struct format) of the word ``name`` of ``part`` (CHANNEL, MESSAGE or TOPIC;
    ``table="record_fields"`` for a topic's subscriber record)."""
    offset, size = part[table][name]
    return offset, _FORMATS[size]


def off(part: Dict[str, Any], name: str, table: str = "fields") -> int:
    """The byte offset of the word ``name`` of ``part``."""
    return int(part[table][name][0])


def peek(buf: Any, part: Dict[str, Any], name: str, base: int = 0, table: str = "fields") -> int:
    """The word ``name`` of ``part`` in ``buf`` (a bytes-like object or an mmap), ``base`` bytes in."""
    offset, fmt = at(part, name, table)
    return int(struct.unpack_from(fmt, buf, base + offset)[0])


def poke(buf: Any, part: Dict[str, Any], name: str, value: int, base: int = 0, table: str = "fields") -> None:
    """Stores ``value`` in the word ``name`` of ``part`` in ``buf``, ``base`` bytes in."""
    offset, fmt = at(part, name, table)
    struct.pack_into(fmt, buf, base + offset, value)


def channel_header(capacity: int) -> bytearray:
    """The header page of a valid channel of ``capacity`` bytes that no end has opened yet."""
    header = bytearray(CHANNEL["header_bytes"])
    poke(header, CHANNEL, "magic", CHANNEL["magic"])
    poke(header, CHANNEL, "version", CHANNEL["version"])
    poke(header, CHANNEL, "header_bytes", CHANNEL["header_bytes"])
    poke(header, CHANNEL, "capacity", capacity)
    return header


def topic_data_offset(max_subscribers: int) -> int:
    """Where a topic's slots' pages begin: the page after the subscriber records (TopicGeometry
    in cpp/shm/topic.h)."""
    end = TOPIC["header_bytes"] + max_subscribers * TOPIC["record_bytes"]
    return (end + PAGE - 1) // PAGE * PAGE
