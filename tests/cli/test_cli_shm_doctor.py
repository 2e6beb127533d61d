"""``python -m fastcopy shm --doctor [--json]`` and the RemoveIPC reading behind it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from _child import child_env, explain

from fastcopy.shm import space

subprocess_only = pytest.mark.skipif(
    os.environ.get("FASTCOPY_NO_SUBPROCESS") == "1",
    reason="FASTCOPY_NO_SUBPROCESS=1: tests that start processes are skipped",
)


def _conf_dir(tmp_path, main=None, dropins=()):
    """A fake /etc/systemd: logind.conf with `main`, logind.conf.d/<name> with each text."""
    d = tmp_path / "systemd"
    (d / "logind.conf.d").mkdir(parents=True)
    if main is not None:
        (d / "logind.conf").write_text(textwrap.dedent(main))
    for name, text in dropins:
        (d / "logind.conf.d" / name).write_text(textwrap.dedent(text))
    return str(d)


@pytest.mark.parametrize("text, expected", [
    ("[Login]\nRemoveIPC=no\n", False),
    ("[Login]\nRemoveIPC = Yes\n", True),
    ("[Login]\n#RemoveIPC=no\n", None),             # the commented default of Debian's file
    ("[Login]\n; RemoveIPC=no\n", None),
    ("[Other]\nRemoveIPC=no\n", None),              # only the [Login] section counts
    ("RemoveIPC=no\n", None),                       # outside any section
    ("[Login]\nRemoveIPC=off\nRemoveIPC=1\n", True),  # the last one wins
    ("[Login]\nRemoveIPC=maybe\n", None),           # a value logind ignores
    ("[Login]\nRemoveIPCs=no\nKillUserProcesses=no\n", None),
])
def test_parse_remove_ipc(text, expected):
    assert space.parse_remove_ipc(text) is expected


def test_logind_remove_ipc_default_main_file_and_dropins(tmp_path):
    assert space.logind_remove_ipc(str(tmp_path / "missing")) == (True, "systemd's default")
    d = _conf_dir(tmp_path, "[Login]\nRemoveIPC=no\n")
    assert space.logind_remove_ipc(d) == (False, os.path.join(d, "logind.conf"))
    d2 = _conf_dir(tmp_path / "b", "[Login]\nRemoveIPC=no\n",
                   [("20-b.conf", "[Login]\nRemoveIPC=yes\n"), ("10-a.conf", "[Login]\nRemoveIPC=no\n"),
                    ("30-c.txt", "[Login]\nRemoveIPC=no\n")])   # not a .conf: ignored
    assert space.logind_remove_ipc(d2) == (True, os.path.join(d2, "logind.conf.d", "20-b.conf"))


def test_remove_ipc_is_a_problem_only_for_a_non_system_user_under_systemd(tmp_path):
    yes = _conf_dir(tmp_path, "[Login]\nRemoveIPC=yes\n")
    r = space.doctor_report(yes, uid=1000, systemd=True)
    assert r["remove_ipc"]["applies"] is True
    assert any("RemoveIPC=yes" in p and "uid 1000" in p and "enable-linger" in p for p in r["problems"]), r
    assert "logind deletes this user's segments" in space.format_doctor(r)
    for uid, systemd in ((0, True), (999, True), (1000, False)):
        r = space.doctor_report(yes, uid=uid, systemd=systemd)
        assert r["remove_ipc"]["applies"] is False and not any("RemoveIPC" in p for p in r["problems"]), r
    no = _conf_dir(tmp_path / "no", "[Login]\nRemoveIPC=no\n")
    r = space.doctor_report(no, uid=1000, systemd=True)
    assert r["remove_ipc"]["applies"] is False and "RemoveIPC:       no" in space.format_doctor(r)


DOCTOR = """
import json, os, subprocess, sys
from fastcopy import shm
# A stale segment: its creator is killed before it can remove it.
child = subprocess.run([sys.executable, "-c",
    "import os, signal; from fastcopy import shm; ch = shm.Channel.create('fcdoc-stale', capacity=1 << 20); "
    "os.kill(os.getpid(), signal.SIGKILL)"])
live = shm.Channel.create("fcdoc-live", capacity=2 << 20)
runs = []
for args in (["--doctor"], ["--doctor", "--json"]):
    p = subprocess.run([sys.executable, "-m", "fastcopy", "shm", *args], capture_output=True, text=True)
    runs.append([p.returncode, p.stdout, p.stderr])
live.close(); live.unlink()
shm.clean_segments()
p = subprocess.run([sys.executable, "-m", "fastcopy", "shm", "--doctor"], capture_output=True, text=True)
runs.append([p.returncode, p.stdout, p.stderr])
print(json.dumps({"child": child.returncode, "runs": runs}))
"""


@subprocess_only
def test_doctor_on_a_small_tmpfs(tmp_path):
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                           capture_output=True, timeout=20)
    if probe.returncode != 0:
        pytest.skip("cannot mount a small tmpfs in a private mount namespace here (needs CAP_SYS_ADMIN)")
    script = tmp_path / "scenario.py"
    script.write_text(textwrap.dedent(DOCTOR))
    conf = _conf_dir(tmp_path, "[Login]\nRemoveIPC=no\n")
    cmd = f"mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {sys.executable} {script}"
    proc = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, timeout=180,
                          env=child_env(FASTCOPY_LOGIND_CONF_DIR=conf), cwd=str(tmp_path))
    assert proc.returncode == 0, explain(proc)
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["child"] == -9
    (rc_text, text, err), (rc_json, js, _), (rc_clean, clean, _) = out["runs"]
    # A stale segment is a problem: exit status 1, in words and in JSON.
    assert rc_text == 1 and rc_json == 1, (text, err)
    assert "/dev/shm (tmpfs)" in text and "size:          64.0 MiB" in text, text
    assert "1 live" in text and "1 stale" in text and "stale:         fcdoc-stale" in text, text
    assert "Docker's default" in text and "--shm-size=1g" in text, text
    assert f"RemoveIPC:       no ({os.path.join(conf, 'logind.conf')})" in text, text
    assert "problem: 1 stale fastcopy segment(s)" in text and "shm --clean" in text, text
    report = json.loads(js)
    assert report["space"]["total"] == 64 << 20 and report["space"]["tmpfs"] is True
    assert report["space"]["used"] + report["space"]["free"] == report["space"]["total"]
    assert report["segments"]["stale_names"] == ["fcdoc-stale"] and report["segments"]["live"] == 1
    assert report["segments"]["live_bytes"] > 2 << 20 and report["segments"]["stale_bytes"] > 1 << 20
    assert report["remove_ipc"]["value"] is False and report["remove_ipc"]["applies"] is False
    # Cleaned: no problem left, exit status 0.
    assert rc_clean == 0 and "no problems found" in clean and "0 live" in clean and "0 stale" in clean, clean
