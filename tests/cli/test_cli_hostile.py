"""Hostile arguments to the command line and the small API: output paths that are not regular
files, numbers without bounds, malformed result files, out-of-range integers, whitespace in the
FASTCOPY_* variables, and Ctrl-C during one large copy."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest

import fastcopy
from fastcopy import _profile, shm
from fastcopy.bench import units

from _cli import SRC_DIR, cli
from conftest import no_subprocess

FAST = ("--repeats", "2", "--min-time", "0.001")
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _env(tmp_path):
    return {"XDG_CACHE_HOME": str(tmp_path / "cache")}


def _fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def _garbage(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not a profile, and not to be deleted\n")
    return path


# ------------------------------------------------------------------ tune --output

def _refused(r, option="--output"):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert f"argument {option}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    # refused before measuring: no table, no progress, nothing written
    assert "changes against the built-in profile" not in r.stdout


def test_tune_output_fifo_is_refused_and_left_a_fifo(tmp_path):
    fifo = _fifo(tmp_path)
    for extra in ((), ("--show",), ("--reset",)):
        r = cli("tune", "--quick", "--grid", "256", "--output", str(fifo), *extra, env=_env(tmp_path), timeout=60)
        _refused(r)
        assert "not a regular file" in r.stderr
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_tune_output_directory_is_refused(tmp_path):
    folder = tmp_path / "dir"
    folder.mkdir()
    for extra in ((), ("--reset",), ("--show",)):
        r = cli("tune", "--quick", "--grid", "256", "--output", str(folder), *extra, env=_env(tmp_path))
        _refused(r)
        assert "is a directory" in r.stderr
        assert folder.is_dir()


def test_tune_output_proc_file_is_refused():
    # /proc/version stats as a regular file, but no file can be made or removed in /proc.
    for extra in ((), ("--reset",)):
        r = cli("tune", "--quick", "--grid", "256", "--output", "/proc/version", *extra)
        _refused(r)


@pytest.mark.skipif(not IS_ROOT, reason="making a character device node needs root")
def test_tune_output_character_device_is_refused_and_left_a_device(tmp_path):
    # A node of our own for /dev/null's device: replacing it would replace only this node.
    node = tmp_path / "null"
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    r = cli("tune", "--quick", "--grid", "256", "--output", str(node), env=_env(tmp_path))
    _refused(r)
    assert stat.S_ISCHR(os.lstat(node).st_mode)
    # /dev/null itself only with --show, which never writes: refused, and still a device.
    r = cli("tune", "--show", "--output", "/dev/null", env=_env(tmp_path))
    _refused(r)
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


def test_tune_empty_output_is_refused_and_the_cache_is_not_written(tmp_path):
    r = cli("tune", "--quick", "--grid", "256", "--output", "", env=_env(tmp_path))
    _refused(r)
    assert not (tmp_path / "cache").exists()


def test_tune_reset_deletes_only_a_profile(tmp_path):
    garbage = _garbage(tmp_path)
    r = cli("tune", "--reset", "--output", str(garbage), env=_env(tmp_path))
    _refused(r)
    assert "not a fastcopy profile" in r.stderr
    assert garbage.read_text() == "not a profile, and not to be deleted\n"
    other_json = tmp_path / "other.json"
    other_json.write_text('{"results": []}')
    r = cli("tune", "--reset", "--output", str(other_json), env=_env(tmp_path))
    _refused(r)
    assert other_json.exists()


def test_tune_writes_over_a_garbage_regular_file(tmp_path):
    # A regular file is a valid output (the profile replaces it); only --reset needs a profile.
    garbage = _garbage(tmp_path)
    r = cli("tune", "--quick", "--grid", "4K", "--output", str(garbage), env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    profile = json.loads(garbage.read_text())
    assert profile["format"] == "fastcopy-profile"
    r = cli("tune", "--reset", "--output", str(garbage), env=_env(tmp_path))
    assert r.returncode == 0 and not garbage.exists()


def test_tune_profile_that_cannot_be_written_at_the_end_goes_to_stdout(tmp_path, monkeypatch, capsys):
    import errno

    from fastcopy.__main__ import main
    from fastcopy.tune import profile as tune

    def disk_full(path, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(tune, "write_whole", disk_full)
    out = tmp_path / "p.json"
    rc = main(["tune", "--quick", "--grid", "4K", "--no-progress", "--output", str(out)])
    captured = capsys.readouterr()
    assert rc == 1 and not out.exists()
    assert f"cannot write {out}: No space left on device" in captured.err
    profile = json.loads(captured.out[captured.out.index("\n{\n") + 1:])
    tune.validate_profile(profile)


def test_fastcopy_tune_refuses_a_bad_output_before_measuring(tmp_path, monkeypatch):
    from fastcopy.tune import measure

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured before checking the output")

    monkeypatch.setattr(measure, "measure", no_measuring)
    with pytest.raises(ValueError, match="is a directory"):
        fastcopy.tune(quick=True, grid=[4096], output=str(tmp_path), progress=False)
    with pytest.raises(ValueError, match="not a regular file"):
        fastcopy.tune(quick=True, grid=[4096], output=str(_fifo(tmp_path)), progress=False)


# ------------------------------------------------------------------ bench numbers

@pytest.mark.parametrize("value", ["inf", "1e300", "-inf", "nan", "1e9"])
def test_bench_min_time_must_be_finite_and_bounded(value):
    r = cli("bench", "--sizes", "64", "--repeats", "1", "--min-time", value, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "argument --min-time" in r.stderr and "Traceback" not in r.stderr


def test_min_time_bound_is_in_help():
    r = cli("bench", "--help")
    assert f"at most {units.MAX_MIN_TIME:g}" in " ".join(r.stdout.split())
    r = cli("tune", "--min-time", "inf")
    assert r.returncode == 2 and "argument --min-time" in r.stderr


@pytest.mark.parametrize("text, words", [
    ("1:2:xinf", "finite"),
    ("1:2:xnan", "finite"),
    ("1:1G:x1.0000000000000002", "more than"),
    ("1:1G:+1", "more than"),
])
def test_bench_sizes_are_bounded(text, words):
    with pytest.raises(ValueError, match=words):
        units.parse_sizes(text)
    r = cli("bench", "--sizes", text, *FAST, timeout=60)
    assert r.returncode == 2 and "argument --sizes" in r.stderr and words in r.stderr, r.stderr


@pytest.mark.parametrize("args", [("--repeats", "100001"), ("--repeats", str(2 ** 64)), ("--threads", "1025"),
                                  ("--torch-threads", str(2 ** 64))])
def test_bench_counts_are_bounded(args):
    r = cli("bench", "--sizes", "64", "--min-time", "0.001", *args, timeout=60)
    assert r.returncode == 2 and f"argument {args[0]}: must be at most" in r.stderr, r.stderr
    r = cli("bench", "--help")
    assert "at most 100000" in " ".join(r.stdout.split())


def test_tune_show_reads_at_most_a_profile_size(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(_profile.MAX_PROFILE_BYTES + 1)  # sparse: no disk used
    r = cli("tune", "--show", "--output", str(big), env=_env(tmp_path))
    assert r.returncode == 0 and "unusable profile" in r.stdout and "limit" in r.stdout, r.stdout


def test_bench_size_cap_is_in_help():
    r = cli("bench", "--help")
    assert f"at most {units.MAX_SIZES}" in " ".join(r.stdout.split())


# ------------------------------------------------------------------ bench --json

@pytest.mark.parametrize("kind", ["dir", "fifo", "devfull"])
def test_bench_json_must_be_a_regular_file_or_new_path(tmp_path, kind):
    if kind == "dir":
        target = str(tmp_path)
    elif kind == "fifo":
        target = str(_fifo(tmp_path))
    else:
        if not os.path.exists("/dev/full"):
            pytest.skip("no /dev/full")
        target = "/dev/full"
    for option in ("--json", "--plot"):
        r = cli("bench", "--sizes", "64", *FAST, "--variants", "fastcopy", option, target, timeout=60)
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert f"argument {option}" in r.stderr and "Traceback" not in r.stderr
        assert "GB/s" not in r.stdout  # refused before the run
    if kind == "fifo":
        assert stat.S_ISFIFO(os.lstat(target).st_mode)


@no_subprocess
def test_bench_json_that_cannot_be_written_at_the_end_goes_to_stdout(tmp_path):
    import resource

    # A file size limit of 4 KiB: the run goes, the JSON (larger) fails with EFBIG at the end
    # (Python ignores SIGXFSZ, so the write raises instead of ending the process).
    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    out = tmp_path / "run.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTCOPY_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC_DIR, os.environ.get("PYTHONPATH")) if p)
    p = subprocess.run([sys.executable, "-m", "fastcopy", "bench", "--sizes", "64", *FAST, "--variants", "fastcopy",
                        "--json", str(out)], env=env, capture_output=True, text=True, timeout=120,
                       preexec_fn=limit_file_size)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and str(out) in p.stderr and "File too large" in p.stderr, p.stderr
    doc = json.loads(p.stdout[p.stdout.index("\n{\n") + 1:])
    assert doc["kind"] == "bench" and doc["results"] and doc["results"][0]["size"] == 64
    assert os.listdir(tmp_path) == []  # no half-written file


# ------------------------------------------------------------------ compare

@pytest.fixture(scope="module")
def good_json(tmp_path_factory):
    path = tmp_path_factory.mktemp("cmp") / "good.json"
    r = cli("bench", "--sizes", "64", *FAST, "--variants", "fastcopy", "--json", str(path))
    assert r.returncode == 0, r.stderr
    return path


def _with_results(tmp_path, good_json, results, name="bad.json"):
    doc = json.loads(good_json.read_text())
    doc["results"] = results
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("results, words", [
    ([None], "results[0]"),
    ([1, 2], "results[0]"),
    ([{"size": "x", "variant": "fastcopy", "median_gbps": 1.0, "min_gbps": 1.0, "max_gbps": 1.0}], "size"),
    ([{"size": 64, "variant": "fastcopy", "median_gbps": "fast", "min_gbps": 1.0, "max_gbps": 1.0}],
     "median_gbps"),
    ([{"size": 64, "variant": "fastcopy", "median_gbps": 1.0}], "min_gbps"),
    ([{"size": 64, "variant": None, "median_gbps": 1.0, "min_gbps": 1.0, "max_gbps": 1.0}], "variant"),
])
def test_compare_validates_the_results(tmp_path, good_json, results, words):
    bad = _with_results(tmp_path, good_json, results)
    for a, b in ((good_json, bad), (bad, good_json)):
        r = cli("compare", str(a), str(b))
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert "bad.json" in r.stderr and words in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_compare_refuses_files_that_are_not_regular(tmp_path, good_json):
    fifo = _fifo(tmp_path)
    for target in (str(fifo), "/dev/zero", str(tmp_path)):
        r = cli("compare", str(good_json), target, timeout=60)
        assert r.returncode == 2, (target, r.stdout, r.stderr)
        assert target in r.stderr and "Traceback" not in r.stderr


def test_compare_refuses_files_larger_than_the_cap(tmp_path, good_json):
    from fastcopy.bench import compare

    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(compare.MAX_RESULT_BYTES + 1)  # sparse: no disk used
    r = cli("compare", str(good_json), str(big))
    assert r.returncode == 2 and "big.json" in r.stderr and "larger than" in r.stderr, r.stderr


# ------------------------------------------------------------------ integer arguments

def test_set_threads_out_of_range_names_the_bounds():
    for bad in (2 ** 64, -(2 ** 64), 1025, -1):
        with pytest.raises((ValueError, OverflowError), match="0 .*1 to 1024"):
            fastcopy.set_threads(bad)
    assert fastcopy.get_threads() >= 1


def test_kernel_threads_out_of_range_and_bool():
    for bad in (2 ** 63, 2 ** 64, -(2 ** 63) - 1):
        with pytest.raises((ValueError, OverflowError), match="threads must be 1 to 1024"):
            fastcopy.kernel("generic", threads=bad)
    for bad in (True, False, 2.0, "2"):
        with pytest.raises(TypeError, match="threads"):
            fastcopy.kernel("generic", threads=bad)
    with pytest.raises(TypeError):
        fastcopy.set_threads(True)


def test_channel_capacity_out_of_range_names_the_bounds():
    for bad in (-1, 2 ** 64, 1000, 1 << 41):
        with pytest.raises(ValueError, match=r"capacity .* out of range: use 65536 \(64 KiB\) to"):
            shm.Channel.create(capacity=bad)
        with pytest.raises(shm.ChannelError):
            shm.Channel.create(capacity=bad)


def test_invalid_names_are_value_errors_and_channel_errors():
    for bad in ("a/b", "", "x" * 201, "a\x01b", ".."):
        for make in (lambda n: shm.Channel.create(n), lambda n: shm.Channel.attach(n),
                     lambda n: shm.Topic.create(n, slot_bytes=64), lambda n: shm.Topic.subscribe(n)):
            with pytest.raises(ValueError, match="name") as info:
                make(bad)
            assert isinstance(info.value, shm.ChannelError)


# ------------------------------------------------------------------ FASTCOPY_* variables

def _import_with(env_vars):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTCOPY_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC_DIR, os.environ.get("PYTHONPATH")) if p)
    env.update(env_vars)
    code = ("import json, fastcopy; i = fastcopy.info(); "
            "print(json.dumps({'threads': fastcopy.get_threads(), 'overrides': fastcopy._core.overrides(), "
            "'forced': i['profile']['forced_kernel'], 'nt': fastcopy._core.nt_threshold()}))")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@no_subprocess
def test_fastcopy_threads_zero_means_the_default():
    default = _import_with({})
    zero = _import_with({"FASTCOPY_THREADS": "0"})
    assert zero["threads"] == default["threads"]
    assert zero["overrides"]["FASTCOPY_THREADS"] is None


@no_subprocess
def test_every_fastcopy_variable_strips_surrounding_whitespace():
    got = _import_with({"FASTCOPY_THREADS": " 2 ", "FASTCOPY_KERNEL": " generic\t", "FASTCOPY_REP_MOVSB": " off ",
                        "FASTCOPY_NT_THRESHOLD": " 1M "})
    assert got["threads"] == 2 and got["forced"] == "generic"
    assert got["overrides"]["FASTCOPY_THREADS"] == 2
    assert got["overrides"]["FASTCOPY_NT_THRESHOLD"] == 1 << 20 and got["nt"] == 1 << 20
    blank = _import_with({"FASTCOPY_KERNEL": "  ", "FASTCOPY_THREADS": " "})
    assert blank["forced"] is None and blank["overrides"]["FASTCOPY_THREADS"] is None


@no_subprocess
def test_fastcopy_profile_strips_surrounding_whitespace(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTCOPY_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC_DIR, os.environ.get("PYTHONPATH")) if p)
    path = tmp_path / "p.json"
    path.write_text(fastcopy._core.active_profile_json())
    env["FASTCOPY_PROFILE"] = f"  {path}\n"
    code = "import fastcopy, json; print(json.dumps(fastcopy.info()['profile_source']))"
    p = subprocess.run([sys.executable, "-W", "error", "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["path"] == str(path)


# ------------------------------------------------------------------ Ctrl-C in one large copy

@no_subprocess
def test_ctrl_c_interrupts_one_large_copy():
    # A CPU-time timer (ITIMER_PROF) fires after 2 ms of CPU time spent in the copy, whatever the
    # machine's speed or load; its handler raises SIGINT, whose default handler raises
    # KeyboardInterrupt. A 1.5 GiB copy needs far more than 2 ms of CPU, so the interrupt lands
    # inside the one call: the destination's end is still unwritten.
    code = textwrap.dedent("""
        import signal, sys
        import numpy as np
        import fastcopy

        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGPROF, lambda *a: signal.raise_signal(signal.SIGINT))
        n = 3 << 29  # 1.5 GiB each: 3 GiB in all
        src = np.ones(n, np.uint8)
        dst = np.zeros(n, np.uint8)
        for kind in ("copy", "kernel", "copyto", "stack"):
            dst[:] = 0
            f = {"copy": fastcopy.copy, "kernel": fastcopy.kernel("generic", threads=2),
                 "copyto": fastcopy.copyto,
                 "stack": lambda d, s: fastcopy.stack([s], out=d.reshape(1, -1))}[kind]
            signal.setitimer(signal.ITIMER_PROF, 0.002)
            try:
                f(dst, src)
            except KeyboardInterrupt:
                signal.setitimer(signal.ITIMER_PROF, 0)
                print(kind, "interrupted", int(dst[0]), int(dst[-1]))
            else:
                signal.setitimer(signal.ITIMER_PROF, 0)
                print(kind, "finished", int(dst[0]), int(dst[-1]))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTCOPY_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC_DIR, os.environ.get("PYTHONPATH")) if p)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    # started (the first byte written), stopped before the end (the last byte not)
    assert p.stdout.split("\n")[:4] == ["copy interrupted 1 0", "kernel interrupted 1 0", "copyto interrupted 1 0",
                                         "stack interrupted 1 0"], p.stdout
