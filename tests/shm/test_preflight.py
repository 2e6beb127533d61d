"""The /dev/shm preflight: Channel.create and Topic.create check the free space before anything
is created, and a full /dev/shm is one error (fastcopy.shm.ShmSpaceError) naming the sizes and
the fix, whether the preflight or posix_fallocate finds it. The scenarios run in a private mount
namespace with a small tmpfs on /dev/shm (needs root or CAP_SYS_ADMIN), in a child process."""
from __future__ import annotations

import errno
import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
from _child import child_env, explain

from fastcopy import shm

subprocess_only = pytest.mark.skipif(
    os.environ.get("FASTCOPY_NO_SUBPROCESS") == "1",
    reason="FASTCOPY_NO_SUBPROCESS=1: tests that start processes are skipped",
)


def _can_mount_small_tmpfs() -> bool:
    try:
        r = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                           capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def run_in_small_tmpfs(tmp_path, code: str, size: str = "32m") -> dict:
    """Runs `code` with a private tmpfs of `size` on /dev/shm; returns the JSON it prints last."""
    if not _can_mount_small_tmpfs():
        pytest.skip("cannot mount a small tmpfs in a private mount namespace here (needs CAP_SYS_ADMIN)")
    script = tmp_path / "scenario.py"
    script.write_text(textwrap.dedent(code))
    cmd = f"mount -t tmpfs -o size={size} tmpfs /dev/shm && exec {sys.executable} {script}"
    proc = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, timeout=120,
                          env=child_env(), cwd=str(tmp_path))
    assert proc.returncode == 0, explain(proc)  # not -7 (SIGBUS)
    return json.loads(proc.stdout.splitlines()[-1])


PREFLIGHT = """
import json, os
from fastcopy import shm
out = {}
st = os.statvfs("/dev/shm")
free = st.f_bavail * st.f_frsize
out["free"] = free
out["ok_at_free"] = shm.preflight(free)          # exactly the free bytes fit
try:
    shm.preflight(free + 1)                      # one byte more is one page more
    out["over"] = None
except shm.ShmSpaceError as e:
    out["over"] = [e.errno, e.needed, e.free, e.path]
out["zero"] = shm.preflight(0)

def attempt(name, make):
    try:
        make(name)
        return None
    except Exception as e:
        return {"type": type(e).__name__, "oserror": isinstance(e, OSError),
                "channel_error": isinstance(e, shm.ChannelError), "errno": getattr(e, "errno", None),
                "needed": getattr(e, "needed", None), "free": getattr(e, "free", None), "msg": str(e),
                "name": name}

out["channel"] = attempt("fcpf-big", lambda n: shm.Channel.create(n, capacity=48 << 20))
out["topic"] = attempt("fcpf-topic", lambda n: shm.Topic.create(n, slot_bytes=16 << 20, slots=3))
out["names_after"] = sorted(os.listdir("/dev/shm"))
# What fits is created as before.
with shm.Channel.create("fcpf-fits", capacity=8 << 20) as ch:
    out["fits"] = os.path.exists("/dev/shm/" + ch.name)
print(json.dumps(out))
"""


@subprocess_only
def test_preflight_refuses_before_anything_is_created(tmp_path):
    out = run_in_small_tmpfs(tmp_path, PREFLIGHT)
    free = out["free"]
    assert out["ok_at_free"] == free and out["zero"] == free
    assert out["over"] == [errno.ENOSPC, free + 4096, free, "/dev/shm"]
    for what in ("channel", "topic"):
        err = out[what]
        assert err is not None, f"{what}: created in a 32 MiB /dev/shm"
        assert err["type"] == "ShmSpaceError" and err["oserror"] and err["channel_error"], err
        assert err["errno"] == errno.ENOSPC and err["needed"] > err["free"], err
        msg = err["msg"]
        # The preflight's words, not those of posix_fallocate's ENOSPC (space taken after the check).
        assert msg.startswith(f"[Errno 28] cannot create shared memory segment '{err['name']}': it needs "), msg
        assert f"({err['needed']} bytes)" in msg and f"({err['free']} bytes)" in msg, msg
        assert "/dev/shm" in msg and "--shm-size=64m" not in msg and "--shm-size=128m" in msg, msg
        assert "emptyDir" in msg and "medium: Memory" in msg, msg
    assert out["names_after"] == [], "a refused create left a name (or a temporary file) in /dev/shm"
    assert out["fits"] is True


ATTACH_SPARSE = """
import json, os, sys
sys.path.insert(0, {tests!r})
from _shm_layout import CHANNEL, channel_header
from fastcopy import shm
name = "fcpf-sparse"
cap = 48 << 20
with open("/dev/shm/" + name, "wb") as f:
    f.write(channel_header(cap))
    f.truncate(CHANNEL["header_bytes"] + cap)
try:
    shm.Channel.attach(name)
    out = None
except shm.ShmSpaceError as e:
    out = {{"errno": e.errno, "needed": e.needed, "free": e.free, "msg": str(e)}}
print(json.dumps(out))
"""


@subprocess_only
def test_enospc_from_fallocate_is_the_same_error(tmp_path):
    # posix_fallocate's ENOSPC (what a create meets when another process takes the space after
    # its preflight) is the preflight's error: forced here through attach to a sparse segment
    # larger than the tmpfs, which allocates its pages with the same call.
    tests = os.path.dirname(os.path.abspath(__file__))
    out = run_in_small_tmpfs(tmp_path, ATTACH_SPARSE.format(tests=tests))
    assert out is not None, "attach to a 48 MiB sparse segment in a 32 MiB /dev/shm did not raise ShmSpaceError"
    assert out["errno"] == errno.ENOSPC and out["needed"] > out["free"], out
    assert out["msg"].startswith("[Errno 28] cannot attach to shared memory segment 'fcpf-sparse': it needs"), out
    assert "--shm-size=" in out["msg"] and f"({out['needed']} bytes)" in out["msg"], out


def test_space_error_is_an_oserror_and_a_channel_error_and_pickles():
    e = shm.ShmSpaceError(errno.ENOSPC, "no room", 8192, 4096, "/dev/shm")
    assert isinstance(e, OSError) and isinstance(e, shm.ChannelError)
    assert e.errno == errno.ENOSPC and (e.needed, e.free, e.path) == (8192, 4096, "/dev/shm")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is shm.ShmSpaceError and (back.errno, back.strerror, back.needed, back.free, back.path) == (
        errno.ENOSPC, "no room", 8192, 4096, "/dev/shm")


def test_preflight_arguments():
    st = os.statvfs("/dev/shm")
    assert shm.preflight(0) > 0
    with pytest.raises(ValueError, match="nbytes must be >= 0"):
        shm.preflight(-1)
    with pytest.raises(TypeError):
        shm.preflight(1.5)  # type: ignore[arg-type]
    with pytest.raises(shm.ShmSpaceError, match="--shm-size="):
        shm.preflight(st.f_blocks * st.f_frsize + (1 << 30))  # more than the whole of /dev/shm
    for huge in (2**64 - 1, 2**64 - 4096, 2**63):  # no wrap-around in the page rounding or the suggested size
        with pytest.raises(shm.ShmSpaceError, match="--shm-size=") as e:
            shm.preflight(huge)
        assert e.value.needed >= huge
