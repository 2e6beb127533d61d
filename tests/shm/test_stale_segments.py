"""Names left in /dev/shm: the creators' exits (multiprocessing children, SIGTERM, SIGHUP)
remove theirs, and ``python -m fastcopy shm --list`` / ``--clean`` find and remove what a killed
creator left, and nothing else.

Each runs processes. FASTCOPY_NO_SUBPROCESS=1 skips them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from _child import child_env, explain, leftovers_fixture, run_script, shm_names
from _shm_layout import CHANNEL, channel_header, poke
from _shm_scenarios import LEAK

from fastcopy import _core, shm

pytestmark = pytest.mark.sanitize

subprocess_only = pytest.mark.skipif(
    os.environ.get("FASTCOPY_NO_SUBPROCESS") == "1",
    reason="FASTCOPY_NO_SUBPROCESS=1: tests that start processes are skipped",
)

PREFIX = f"fcts-{os.getpid()}-"
_remove_this_runs_segments = leftovers_fixture(PREFIX, fail=False)


@subprocess_only
@pytest.mark.parametrize("case", ["fork", "forkserver", "spawn", "pool-close", "pool-terminate", "SIGTERM", "SIGHUP"])
def test_channels_of_ending_creators_are_unlinked(tmp_path, case):
    prefix = f"{PREFIX}leak-"
    proc = run_script(tmp_path, LEAK, case, prefix, timeout=120)
    assert proc.returncode == 0, explain(proc)
    if case.startswith("SIG"):  # the process still ends by the signal
        assert f"signal {int(getattr(signal, case))}" in proc.stdout, explain(proc)
    left = shm_names(prefix)
    for name in left:
        os.unlink("/dev/shm/" + name)
    assert left == set(), explain(proc)


@subprocess_only
def test_shm_cli_lists_and_cleans_only_stale_segments(tmp_path):
    prefix = f"{PREFIX}leak-"
    proc = run_script(tmp_path, LEAK, "SIGKILL", prefix, timeout=60)
    assert proc.returncode == 0 and "signal 9" in proc.stdout, explain(proc)
    stale = shm_names(prefix)
    assert len(stale) == 1          # SIGKILL cannot be caught: the name stays
    live = shm.Channel.create(f"{PREFIX}live", capacity=1 << 16)
    try:
        cli = [sys.executable, "-m", "fastcopy", "shm", "--prefix", PREFIX]
        listing = subprocess.run(cli + ["--list"], capture_output=True, text=True, env=child_env(), timeout=60)
        assert listing.returncode == 0, listing.stderr
        rows = {line.split()[0]: line for line in listing.stdout.splitlines()[1:]}
        (stale_name,) = stale
        assert rows[stale_name].endswith("stale") and "(gone)" in rows[stale_name]
        assert rows[live.name].endswith("in use") and f"{os.getpid()} (alive)" in rows[live.name]
        cleaned = subprocess.run(cli + ["--clean"], capture_output=True, text=True, env=child_env(), timeout=60)
        assert cleaned.returncode == 0, cleaned.stderr
        assert f"removed /dev/shm/{stale_name}" in cleaned.stdout
        assert shm_names(prefix) == set()
        assert os.path.exists("/dev/shm/" + live.name)   # a running creator's segment stays
    finally:
        for name in shm_names(prefix):
            os.unlink("/dev/shm/" + name)
        live.close()
        live.unlink()


@subprocess_only
def test_shm_cli_skips_what_is_not_a_regular_file(tmp_path):
    """/dev/shm is writable by every user: a FIFO there (opening it for reading waits for a
    writer), a symbolic link to a file that looks like a stale segment, and a directory, all
    under this run's prefix, must neither block ``--list`` / ``--clean`` nor be listed or removed;
    the real stale segment is listed and removed. The bounded wait proves that the CLI ends, it
    does not time it."""
    prefix = f"{PREFIX}odd-"
    proc = run_script(tmp_path, LEAK, "SIGKILL", prefix, timeout=60)
    assert proc.returncode == 0 and "signal 9" in proc.stdout, explain(proc)
    (stale_name,) = shm_names(prefix)   # SIGKILL cannot be caught: the name stays
    # A file with a stale channel's header: its creator (this process, with a start time that
    # is not its own) is gone. Reached only through the link.
    target = tmp_path / "looks-stale"
    header = channel_header(1 << 16)
    poke(header, CHANNEL, "creator_pid", os.getpid())
    poke(header, CHANNEL, "creator_start", 1)
    target.write_bytes(bytes(header) + bytes(1 << 16))
    odd = {"fifo": f"{prefix}fifo", "link": f"{prefix}link", "dir": f"{prefix}dir"}
    os.mkfifo("/dev/shm/" + odd["fifo"])
    os.symlink(target, "/dev/shm/" + odd["link"])
    os.mkdir("/dev/shm/" + odd["dir"])
    cli = [sys.executable, "-m", "fastcopy", "shm", "--prefix", prefix]
    # Each CLI call ends in well under a second; the bound only stops one blocked on the FIFO.
    listing = subprocess.run(cli + ["--list"], capture_output=True, text=True, env=child_env(), timeout=10)
    assert listing.returncode == 0, listing.stderr
    rows = {line.split()[0]: line for line in listing.stdout.splitlines()[1:]}
    assert set(rows) == {stale_name} and rows[stale_name].endswith("stale"), listing.stdout
    cleaned = subprocess.run(cli + ["--clean"], capture_output=True, text=True, env=child_env(), timeout=10)
    assert cleaned.returncode == 0, cleaned.stderr
    removed = [line for line in cleaned.stdout.splitlines() if line.startswith("removed ")]
    assert removed == [f"removed /dev/shm/{stale_name}"], cleaned.stdout
    assert shm_names(prefix) == set(odd.values())     # the FIFO, the link and the directory stay
    assert target.exists()


def test_list_segments_reads_headers_as_the_core_reports_them():
    """What list_segments reads from a channel's and a topic's header through the layout is what
    the C++ ends report: the creator, the ends, the capacity."""
    from _shm_layout import TOPIC, peek

    with shm.Channel.create(f"{PREFIX}layout-ch", capacity=1 << 16) as tx, shm.Channel.attach(tx.name) as rx:
        tx.send(b"x")
        rx.recv(timeout=1)
        with shm.Topic.create(f"{PREFIX}layout-t", slot_bytes=256, slots=4, max_subscribers=3) as t, \
                shm.Topic.subscribe(t.name):
            seen = {seg["name"]: seg for seg in shm.list_segments(f"{PREFIX}layout-")}
            with open("/dev/shm/" + tx.name, "rb") as f:
                head = f.read(CHANNEL["header_bytes"])
            with open("/dev/shm/" + t.name, "rb") as f:
                topic_head = f.read(TOPIC["header_bytes"])
    assert peek(head, CHANNEL, "magic") == CHANNEL["magic"]
    assert peek(head, CHANNEL, "version") == _core.SHM_CHANNEL_VERSION
    assert peek(topic_head, TOPIC, "magic") == TOPIC["magic"]
    assert peek(topic_head, TOPIC, "version") == _core.SHM_TOPIC_VERSION
    assert peek(topic_head, TOPIC, "max_subscribers") == 3
    ch, top = seen[tx.name], seen[t.name]
    me = os.getpid()
    assert (ch["kind"], ch["capacity"], ch["creator_pid"], ch["producer_pid"], ch["consumer_pid"]) == \
        ("channel", 1 << 16, me, me, me), ch
    assert ch["creator_alive"] and ch["ends_alive"] and not ch["stale"], ch
    assert (top["kind"], top["capacity"], top["creator_pid"], top["producer_pid"], top["subscriber_pids"]) == \
        ("topic", 4 * 256, me, me, [me]), top


# Moves every header word but the magic number 2048 bytes further and a topic's subscriber
# records to 96-byte strides, in _core.shm_layout() before fastcopy.shm reads it; writes a
# channel and a topic segment by that layout into a directory and lists it.
MOVED_LAYOUT = r"""
import copy, json, os, struct, sys
from fastcopy import _core

real = _core.shm_layout()
moved = copy.deepcopy(real)
for part in ("channel", "topic"):
    moved[part]["fields"] = {name: (offset if name == "magic" else offset + 2048, size)
                             for name, (offset, size) in real[part]["fields"].items()}
moved["topic"]["record_bytes"] = 96
_core.shm_layout = lambda: moved

def put(buf, fields, name, value, base=0):
    offset, size = fields[name]
    struct.pack_into({4: "=I", 8: "=Q"}[size], buf, base + offset, value)

directory, me = sys.argv[1], os.getpid()
ch, f = moved["channel"], moved["channel"]["fields"]
head = bytearray(ch["header_bytes"])
for name, value in (("magic", ch["magic"]), ("version", ch["version"]), ("capacity", 1 << 20),
                    ("creator_pid", me), ("producer_pid", 1), ("consumer_pid", me)):
    put(head, f, name, value)
with open(os.path.join(directory, "moved-channel"), "wb") as out:
    out.write(head)
top, f, rf = moved["topic"], moved["topic"]["fields"], moved["topic"]["record_fields"]
head = bytearray(top["header_bytes"] + 2 * top["record_bytes"])
for name, value in (("magic", top["magic"]), ("version", top["version"]), ("slots", 3), ("slot_bytes", 512),
                    ("max_subscribers", 2), ("creator_pid", me), ("publisher_pid", me)):
    put(head, f, name, value)
put(head, rf, "state", top["record_states"]["active"], top["header_bytes"] + top["record_bytes"])
put(head, rf, "pid", me, top["header_bytes"] + top["record_bytes"])
with open(os.path.join(directory, "moved-topic"), "wb") as out:
    out.write(head)

from fastcopy import shm
print(json.dumps({"pid": me, "segments": shm.list_segments("moved-", directory)}))
"""


@subprocess_only
def test_list_segments_reads_the_layout_from_the_core(tmp_path):
    """list_segments reads every header word where _core.shm_layout() says it is: with a layout
    whose words all moved, it reads segments written by that layout (a Python copy of the
    offsets would read zeros and miss the topic's subscriber)."""
    import json

    segments = tmp_path / "segments"
    segments.mkdir()
    proc = run_script(tmp_path, MOVED_LAYOUT, str(segments), timeout=60)
    assert proc.returncode == 0, explain(proc)
    out = json.loads(proc.stdout)
    me, listed = out["pid"], {seg["name"]: seg for seg in out["segments"]}
    ch, top = listed["moved-channel"], listed["moved-topic"]
    assert (ch["kind"], ch["capacity"], ch["creator_pid"], ch["producer_pid"], ch["consumer_pid"]) == \
        ("channel", 1 << 20, me, 1, me), ch
    assert (top["kind"], top["capacity"], top["creator_pid"], top["producer_pid"], top["subscriber_pids"]) == \
        ("topic", 3 * 512, me, me, [me]), top


@subprocess_only
def test_a_segment_whose_creator_was_killed_while_making_it_is_listed_and_cleaned():
    """A segment is made under a name of its own and linked to its name once initialised; a
    creator killed in between (SIGKILL: no handler runs) leaves that first name, with no header
    to read. It is listed as unfinished, stale once its creator's pid is gone, and removed by
    --clean; one of a running process stays."""
    creating = _core.shm_layout()["creating_prefix"]
    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                            text=True, timeout=60)
    dead_pid = int(exited.stdout)
    gone, running = f"{creating}{dead_pid}-0", f"{creating}{os.getpid()}-987654"
    for name in (gone, running):
        fd = os.open("/dev/shm/" + name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(fd, 8192)
        os.close(fd)
    try:
        rows = {s["name"]: s for p in (gone, running) for s in shm.list_segments(p)}
        assert rows[gone]["kind"] == "unfinished" and rows[gone]["stale"] and rows[gone]["creator_pid"] == dead_pid
        assert rows[running]["kind"] == "unfinished" and not rows[running]["stale"]
        cli = [sys.executable, "-m", "fastcopy", "shm"]
        listing = subprocess.run(cli + ["--list", "--prefix", gone], capture_output=True, text=True,
                                 env=child_env(), timeout=60)
        assert "stale (creation never finished)" in listing.stdout, listing.stdout + listing.stderr
        for p in (gone, running):
            cleaned = subprocess.run(cli + ["--clean", "--prefix", p], capture_output=True, text=True,
                                     env=child_env(), timeout=60)
            assert cleaned.returncode == 0, cleaned.stderr
        assert not os.path.exists("/dev/shm/" + gone)
        assert os.path.exists("/dev/shm/" + running)
    finally:
        for name in (gone, running):
            if os.path.exists("/dev/shm/" + name):
                os.unlink("/dev/shm/" + name)
