"""The mutation check's own rules (tools/mutation_check.py): the catalogue loads and names tests
that exist, and --jobs deals the mutants out so that no two workers edit the same file."""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("mutation_check", ROOT / "tools" / "mutation_check.py")
mutation_check = importlib.util.module_from_spec(spec)
sys.modules["mutation_check"] = mutation_check  # its dataclasses look their module up there
spec.loader.exec_module(mutation_check)


@pytest.fixture(scope="module")
def catalogue():
    return mutation_check.load_catalogue(mutation_check.CATALOGUE)


def test_every_catalogue_entry_names_a_test_file_that_exists_and_a_ctest_that_is_registered(catalogue):
    cmake = (ROOT / "cpp" / "tests" / "CMakeLists.txt").read_text()
    registered = set(re.findall(r"add_test\(NAME\s+(\w+)", cmake))
    assert registered, "no add_test(NAME ...) found in cpp/tests/CMakeLists.txt"
    for m in catalogue:
        assert (ROOT / m.file).is_file(), f"{m.name}: {m.file} does not exist"
        for test_id in m.pytest:
            assert (ROOT / test_id.split("::")[0]).is_file(), f"{m.name}: {test_id} names no file"
        for name in m.ctest:
            assert name in registered, f"{m.name}: ctest {name} is not registered"


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
