"""Room in /dev/shm: :func:`preflight` (the check ``Channel.create`` and ``Topic.create`` make
before anything is created, for a caller about to create several segments) and the report of
``python -m fastcopy shm --doctor`` (size and use of /dev/shm, fastcopy segments, systemd-logind's
``RemoveIPC``). The check itself and the free space are the C++ core's (``_core.shm_preflight``,
``_core.shm_space``)."""

from __future__ import annotations

import glob
import operator
import os
from typing import Any, Dict, List, Optional, Tuple

from .. import _core
from .segments import list_segments

# Where systemd-logind reads its settings: the main file, then the drop-ins in name order (a
# later setting wins). FASTCOPY_LOGIND_CONF_DIR replaces /etc/systemd (the doctor's tests use it).
_LOGIND_DIR = "/etc/systemd"
# systemd's booleans (systemd's parse_boolean).
_TRUE = {"1", "yes", "y", "true", "t", "on"}
_FALSE = {"0", "no", "n", "false", "f", "off"}
# Docker's default /dev/shm for a container.
_DOCKER_DEFAULT_SHM = 64 << 20
# systemd removes the IPC objects of users above its SYS_UID_MAX (999 on most distributions).
_SYSTEM_UID_MAX = 999


def preflight(nbytes: int) -> int:
    """Raises :class:`ShmSpaceError` unless ``nbytes`` (rounded up to whole pages) fit in the
    free space of /dev/shm now; returns the free bytes (0 when they cannot be read, and then
    creating decides). Creates nothing. A caller creating several segments passes the sum of
    their sizes (each a capacity plus its header, ``Channel.create`` checks its own): one clear
    error before the first is made. Space can still be taken by another process between this
    check and a create; the create then raises the same error."""
    n = operator.index(nbytes)
    if n < 0:
        raise ValueError(f"nbytes must be >= 0, got {n}")
    return int(_core.shm_preflight(n))


def parse_remove_ipc(text: str) -> Optional[bool]:
    """The ``RemoveIPC=`` of the ``[Login]`` section of a logind.conf text (the last one wins);
    None when it sets none (or an unreadable value, which logind ignores)."""
    section = ""
    value: Optional[bool] = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            continue
        key, sep, val = line.partition("=")
        if section != "Login" or not sep or key.strip() != "RemoveIPC":
            continue
        word = val.strip().lower()
        if word in _TRUE:
            value = True
        elif word in _FALSE:
            value = False
    return value


def logind_remove_ipc(conf_dir: Optional[str] = None) -> Tuple[bool, str]:
    """(RemoveIPC in effect, where it comes from): logind.conf, then logind.conf.d/*.conf in name
    order, under ``conf_dir`` (default /etc/systemd, or FASTCOPY_LOGIND_CONF_DIR). systemd's
    default is yes."""
    base = conf_dir or os.environ.get("FASTCOPY_LOGIND_CONF_DIR") or _LOGIND_DIR
    value, source = True, "systemd's default"
    for path in [os.path.join(base, "logind.conf"), *sorted(glob.glob(os.path.join(base, "logind.conf.d", "*.conf")))]:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                found = parse_remove_ipc(f.read())
        except OSError:
            continue
        if found is not None:
            value, source = found, path
    return value, source


def _is_tmpfs(path: str) -> Optional[bool]:
    """Whether ``path`` is a mount point of a tmpfs, from /proc/self/mounts (None: unknown)."""
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    kinds = [m[2] for m in mounts if len(m) > 2 and m[1] == path]
    return kinds[-1] == "tmpfs" if kinds else None


def doctor_report(conf_dir: Optional[str] = None, uid: Optional[int] = None,
                  systemd: Optional[bool] = None) -> Dict[str, Any]:
    """What ``python -m fastcopy shm --doctor`` reports, as a dict: ``space`` (path, total, free,
    used in bytes; tmpfs), ``segments`` (live and stale counts and bytes, stale names),
    ``remove_ipc`` (value, source, whether it applies to this user), ``problems`` and ``notes``
    (sentences). A problem is what can lose or block segments now: /dev/shm unreadable, stale
    segments, RemoveIPC=yes for a non-system user under systemd. ``uid`` (default: this
    process's) and ``systemd`` (default: whether /run/systemd/system exists) are whom and where
    RemoveIPC is judged for."""
    space = dict(_core.shm_space())
    total, free = space["total"], space["free"]
    space["used"] = total - free if total is not None and free is not None else None
    space["tmpfs"] = _is_tmpfs(space["path"])
    problems: List[str] = []
    notes: List[str] = []
    if total is None:
        problems.append(f"{space['path']} cannot be read (statvfs failed): shared memory is unavailable here")
    segs = list_segments() if total is not None else []
    stale = [s for s in segs if s["stale"]]
    live = [s for s in segs if not s["stale"]]
    segments = {"live": len(live), "live_bytes": sum(s["bytes"] for s in live),
                "stale": len(stale), "stale_bytes": sum(s["bytes"] for s in stale),
                "stale_names": [s["name"] for s in stale]}
    if stale:
        problems.append(f"{len(stale)} stale fastcopy segment(s) hold {_mib(segments['stale_bytes'])}: "
                        "remove them with python -m fastcopy shm --clean")
    if total == _DOCKER_DEFAULT_SHM:
        notes.append(f"{space['path']} is 64 MiB, Docker's default: start the container with a larger one "
                     "(docker run --shm-size=1g) or, in Kubernetes, mount an emptyDir with medium: Memory")
    if space["tmpfs"] is False:
        notes.append(f"{space['path']} is not a tmpfs: segments are written to a disk, not kept in memory")
    remove, source = logind_remove_ipc(conf_dir)
    uid = os.getuid() if uid is None else uid
    systemd = os.path.isdir("/run/systemd/system") if systemd is None else systemd
    applies = remove and uid > _SYSTEM_UID_MAX and systemd
    if applies:
        problems.append(f"systemd-logind has RemoveIPC=yes ({source}) and this user (uid {uid}) is not a system "
                        "user: when this user's last login session ends (logout, ssh disconnect), logind "
                        "deletes this user's segments in /dev/shm, also those of processes still running. "
                        "Keep a session open (loginctl enable-linger), run as a system user, or set "
                        "RemoveIPC=no in /etc/systemd/logind.conf")
    remove_ipc = {"value": remove, "source": source, "uid": uid, "systemd": systemd, "applies": applies}
    return {"space": space, "segments": segments, "remove_ipc": remove_ipc, "problems": problems, "notes": notes}


def _mib(n: Optional[int]) -> str:
    return "unknown" if n is None else f"{n / (1 << 20):.1f} MiB"


def format_doctor(report: Dict[str, Any]) -> str:
    """The report of :func:`doctor_report` in plain words, one fact a line."""
    sp, sg, ri = report["space"], report["segments"], report["remove_ipc"]
    kind = {True: "tmpfs", False: "not tmpfs", None: "filesystem type unknown"}[sp["tmpfs"]]
    lines = [
        f"shared memory:   {sp['path']} ({kind})",
        f"  size:          {_mib(sp['total'])}",
        f"  used:          {_mib(sp['used'])}",
        f"  free:          {_mib(sp['free'])}",
        f"fastcopy segments: {sg['live']} live ({_mib(sg['live_bytes'])}), "
        f"{sg['stale']} stale ({_mib(sg['stale_bytes'])})",
    ]
    lines += [f"  stale:         {name}" for name in sg["stale_names"]]
    where = "" if ri["systemd"] else "; systemd is not running here, so it does not apply"
    lines.append(f"RemoveIPC:       {'yes' if ri['value'] else 'no'} ({ri['source']}){where}")
    if ri["value"] and ri["systemd"] and not ri["applies"]:
        lines.append(f"  this user (uid {ri['uid']}) is a system user: logind leaves its segments alone")
    lines += [f"note: {n}" for n in report["notes"]]
    lines += [f"problem: {p}" for p in report["problems"]]
    if not report["problems"]:
        lines.append("no problems found")
    return "\n".join(lines)
