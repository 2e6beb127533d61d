"""Files the command line reads and writes: which paths may take an output, reading a bounded
regular file, and writing a file whole or not at all.

Shared by ``bench``, ``tune`` and ``compare``.
"""

from __future__ import annotations

import os
import stat
from typing import Optional


def _kind(mode: int) -> str:
    for test, words in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                        (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "not a regular file"


def not_regular(path: str) -> Optional[str]:
    """Why an existing ``path`` is not a regular file (following symlinks), or None when it is one
    or does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"{path}: {e.strerror or e}"
    if stat.S_ISDIR(st.st_mode):
        return f"{path} is a directory"
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file ({_kind(st.st_mode)})"
    return None


def output_problem(path: str) -> Optional[str]:
    """Why ``path`` cannot take an output file, or None. An output is a regular file (replaced
    whole) or a new name in an existing folder where this process can create files: never a
    directory, a device, a FIFO, or a folder such as /proc where files cannot be created."""
    if not path:
        return "an empty path (give a file name)"
    problem = not_regular(path)
    if problem:
        return problem
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"folder {folder} does not exist"
    # Creating a file there is the test that counts: os.access says yes to root in /proc.
    probe = os.path.join(folder, f".{os.path.basename(path)}.probe{os.getpid()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError as e:
        return f"folder {folder} is not writable ({e.strerror or e})"
    os.close(fd)
    os.remove(probe)
    return None


def read_regular(path: str, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; ValueError naming the problem for
    anything else (a directory, a device such as /dev/zero, a FIFO, a larger file)."""
    problem = not_regular(path)
    if problem:
        raise ValueError(problem)
    try:
        # O_NONBLOCK: should the path turn into a FIFO after the stat, open must not hang.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path} is not a regular file ({_kind(st.st_mode)})")
        if st.st_size > limit:
            raise ValueError(f"{path} is {st.st_size} bytes, larger than the {limit} byte limit")
        chunks = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise ValueError(f"{path} is larger than the {limit} byte limit")
    return data


def write_whole(path: str, text: str) -> None:
    """Writes ``text`` to a temporary file next to ``path`` and renames it over ``path``: readers
    never see half a file, and a failed write (a full disk) leaves ``path`` as it was and no
    temporary file behind. OSError on failure."""
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
