"""The mutation check's own rules (tools/mutation_check.py, tools/mutation_catalogue.py): the catalogue loads and names tests
that exist, and --jobs deals the mutants out so that no two workers edit the same file."""
from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("mutation_check", ROOT / "tools" / "mutation_check.py")
mutation_check = importlib.util.module_from_spec(spec)
sys.modules["mutation_check"] = mutation_check  # its dataclasses look their module up there
spec.loader.exec_module(mutation_check)
import mutation_catalogue  # noqa: E402 (beside it: loading mutation_check put tools/ on sys.path)


@pytest.fixture(scope="module")
def catalogue():
    return mutation_catalogue.load_catalogue(mutation_catalogue.CATALOGUE)


def test_every_catalogue_entry_names_a_test_file_that_exists_and_a_ctest_that_is_registered(catalogue):
    cmake = (ROOT / "cpp" / "tests" / "CMakeLists.txt").read_text()
    registered = set(re.findall(r"add_test\(NAME\s+(\w+)", cmake))
    assert registered, "no add_test(NAME ...) found in cpp/tests/CMakeLists.txt"
    for m in catalogue:
        assert (ROOT / m.file).is_file(), f"{m.name}: {m.file} does not exist"
        for test_id in m.pytest:
            assert mutation_catalogue.missing_test(test_id, ROOT) is None, f"{m.name}: {test_id} names no test"
        for name in m.ctest:
            assert name in registered, f"{m.name}: ctest {name} is not registered"


def test_a_test_id_is_found_by_its_file_and_its_function(tmp_path):
    """An id whose function is gone would make pytest fail to collect, which the run would
    count as a kill: it is stale instead."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test_one():\n    pass\n\nModel = object\n"
                                                  "test_machine = Model\n")
    assert mutation_catalogue.missing_test("tests/test_a.py::test_one", tmp_path) is None
    assert mutation_catalogue.missing_test("tests/test_a.py::test_one[param-1]", tmp_path) is None
    assert mutation_catalogue.missing_test("tests/test_a.py::test_machine", tmp_path) is None
    assert "no test test_two" in mutation_catalogue.missing_test("tests/test_a.py::test_two", tmp_path)
    assert "does not exist" in mutation_catalogue.missing_test("tests/test_b.py::test_one", tmp_path)
    m = mutation_catalogue.Mutant("m", "f.py", "x", "y", "why", ["tests/test_a.py::test_two"], [], None)
    (tmp_path / "f.py").write_text("x\n")
    stale, _ = mutation_catalogue.resolve([m], tmp_path)
    assert "no test test_two" in stale["m"]


@pytest.mark.parametrize("jobs", [1, 2, 3, 7])
def test_deal_out_gives_every_mutant_once_and_each_file_to_one_worker(catalogue, jobs):
    shares = mutation_check.deal_out(catalogue, jobs)
    assert len(shares) == jobs
    names = [m.name for share in shares for m in share]
    assert sorted(names) == sorted(m.name for m in catalogue)
    owner = {}
    for k, share in enumerate(shares):
        for m in share:
            assert owner.setdefault(m.file, k) == k, f"{m.file} is dealt to workers {owner[m.file]} and {k}"
        # C++ first, then file by file: each rebuild recompiles one translation unit.
        keys = [(not m.is_cpp, m.file) for m in share]
        assert keys == sorted(keys)


def test_deal_out_balances_the_estimated_time_within_the_largest_file(catalogue):
    def cost(ms):
        return sum(mutation_check.ESTIMATED_SECONDS_CPP if m.is_cpp else mutation_check.ESTIMATED_SECONDS_PY
                   for m in ms)

    files = {m.file for m in catalogue}
    largest = max(cost([m for m in catalogue if m.file == f]) for f in files)
    loads = [cost(share) for share in mutation_check.deal_out(catalogue, 2)]
    assert abs(loads[0] - loads[1]) <= largest, loads
    assert min(loads) > 0


def _mutant(file, original, function=None):
    return mutation_catalogue.Mutant("m", file, original, original + " ", "why", ["tests/x.py::t"], [], function)


CPP_TWO_FUNCTIONS = """\
static int helper(int a);  // a declaration: not a body
int Ring::first(int a) const noexcept {
    if (a < 0) { return 1; }  // "}" in a comment
    const char* s = "{";
    return a + 1;
}
Ring::Ring(int n) : n_(n), m_{n} {
    v = n + 1;
}
int second(int a) {
    if (a < 0) { return 1; }
    return a + 1;
}
"""

PY_TWO_FUNCTIONS = """\
class A:
    def first(self, a):
        if a < 0:
            return 1
        return a + 1

    def second(self, a):
        if a < 0:
            return 1
        return a + 1
"""


@pytest.mark.parametrize("file,text", [("x.cpp", CPP_TWO_FUNCTIONS), ("x.py", PY_TWO_FUNCTIONS)])
def test_a_snippet_that_repeats_is_found_inside_the_function_the_entry_names(tmp_path, file, text):
    (tmp_path / file).write_text(text)
    snippet = "return a + 1;" if file.endswith(".cpp") else "return a + 1"
    second = text.rindex(snippet)
    first = text.index(snippet)
    assert first != second
    assert mutation_catalogue.locate(_mutant(file, snippet), tmp_path, [file])[0] is None  # twice: stale
    assert mutation_catalogue.locate(_mutant(file, snippet, "second"), tmp_path, [file]) == (file, second, None)
    assert mutation_catalogue.locate(_mutant(file, snippet, "first"), tmp_path, [file]) == (file, first, None)
    _, _, why = mutation_catalogue.locate(_mutant(file, snippet, "third"), tmp_path, [file])
    assert why is not None and "third()" in why


def test_cpp_bodies_skip_declarations_comments_strings_and_member_initialisers():
    bodies = mutation_catalogue._cpp_bodies(CPP_TWO_FUNCTIONS, "first")
    assert len(bodies) == 1
    a, b = bodies[0]
    assert CPP_TWO_FUNCTIONS[a] == "{" and CPP_TWO_FUNCTIONS[b - 1] == "}"
    assert "return a + 1;" in CPP_TWO_FUNCTIONS[a:b] and "Ring::Ring" not in CPP_TWO_FUNCTIONS[a:b]
    (ctor,) = mutation_catalogue._cpp_bodies(CPP_TWO_FUNCTIONS, "Ring")
    assert "v = n + 1;" in CPP_TWO_FUNCTIONS[ctor[0]:ctor[1]]
    assert mutation_catalogue._cpp_bodies(CPP_TWO_FUNCTIONS, "helper") == []


def test_a_snippet_whose_file_moved_is_found_in_the_one_file_of_its_kind_that_has_it(tmp_path):
    (tmp_path / "cpp" / "shm").mkdir(parents=True)
    (tmp_path / "cpp" / "shm" / "ring.cpp").write_text(CPP_TWO_FUNCTIONS)
    (tmp_path / "cpp" / "other.py").write_text("return a + 1;\n")  # another kind: not looked at
    files = ["cpp/shm/ring.cpp", "cpp/other.py"]
    m = _mutant("cpp/shm/shm_sync.cpp", "return a + 1;", "second")
    file, offset, why = mutation_catalogue.locate(m, tmp_path, files)
    assert (file, why) == ("cpp/shm/ring.cpp", None)
    assert offset == CPP_TWO_FUNCTIONS.rindex("return a + 1;")
    # Without the function the snippet is ambiguous in the new file: stale, naming where it is.
    _, _, why = mutation_catalogue.locate(_mutant("cpp/shm/shm_sync.cpp", "return a + 1;"), tmp_path, files)
    assert why is not None and "cpp/shm/ring.cpp" in why and "does not exist" in why


def test_a_test_id_whose_file_moved_under_tests_is_found_by_its_name(tmp_path):
    (tmp_path / "tests" / "shm").mkdir(parents=True)
    (tmp_path / "tests" / "shm" / "test_ring.py").write_text("")
    assert (mutation_catalogue.resolve_test_id("tests/test_ring.py::test_a[x]", tmp_path)
            == "tests/shm/test_ring.py::test_a[x]")
    assert mutation_catalogue.resolve_test_id("tests/test_gone.py::t", tmp_path) == "tests/test_gone.py::t"


def test_a_catalogue_folder_loads_every_file_and_refuses_a_name_used_twice(tmp_path):
    entry = ("[[mutant]]\nname = '{n}'\nfile = 'cpp/x.cpp'\nwhy = 'w'\noriginal = 'a'\nreplacement = 'b'\n"
             "pytest = ['tests/t.py::t']\n")
    (tmp_path / "b.toml").write_text(entry.format(n="second"))
    (tmp_path / "a.toml").write_text(entry.format(n="first") + "function = 'f'\n")
    ms = mutation_catalogue.load_catalogue(tmp_path)
    assert [(m.name, m.function) for m in ms] == [("first", "f"), ("second", None)]
    (tmp_path / "c.toml").write_text(entry.format(n="first"))
    with pytest.raises(SystemExit, match="duplicate mutant name first"):
        mutation_catalogue.load_catalogue(tmp_path)


@pytest.mark.skipif(os.environ.get("FASTCOPY_NO_SUBPROCESS") == "1",
                    reason="FASTCOPY_NO_SUBPROCESS=1: tests that start processes are skipped")
def test_the_run_removes_the_stale_segments_its_tests_left_and_nothing_else(tmp_path):
    """A planted bug can kill a test before it removes its channel; the run removes what became
    stale (its creator killed), and leaves a live channel and a file that is not a segment."""
    import subprocess

    from _child import child_env, shm_names

    from fastcopy import shm

    prefix = f"fcmut-{os.getpid()}-"
    killed = (f"import os, signal\nfrom fastcopy import shm\nch = shm.Channel.create({prefix + 'killed'!r}, "
              "capacity=1 << 16)\nos.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", killed], env=child_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9, proc.stderr
    stale = shm_names(prefix)
    assert stale == {prefix + "killed"}
    live = shm.Channel.create(f"{prefix}live", capacity=1 << 16)
    other = Path("/dev/shm") / f"{prefix}other"
    other.write_bytes(b"not a segment")
    try:
        assert mutation_check.remove_stale_segments(stale | {live.name, other.name}) == 1
        assert shm_names(prefix) == {live.name, other.name}
    finally:
        for name in shm_names(prefix) - {live.name}:
            os.unlink("/dev/shm/" + name)
        live.close()
        live.unlink()
