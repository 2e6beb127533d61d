#!/usr/bin/env python3
"""Mutation check: plants each bug of the catalogue tools/mutants/ in a scratch copy of the tree,
rebuilds incrementally, runs only the tests the catalogue names for it and reports whether
they caught it.

    python tools/mutation_check.py              # every mutant
    python tools/mutation_check.py --list       # the catalogue
    python tools/mutation_check.py --only NAME  # one mutant (repeatable; shell globs allowed)
    python tools/mutation_check.py --stale-only # only check that every patch still applies
    python tools/mutation_check.py --build-only # only sync and build the scratch copies
    python tools/mutation_check.py --jobs 2     # two workers, each with its own scratch copy

Per mutant one line: `killed`, `SURVIVED` (the named tests passed with the bug in place),
`STALE` (its `original` snippet is not found exactly once where the entry points: the code
changed under it, so the catalogue entry must be refreshed) or `BROKEN` (the mutant does not compile: fix the
replacement). The run ends with `N mutants, K killed` and exits 0 only when every mutant
was killed. Before the mutants, a baseline run of every named test on the unmutated tree
must pass (otherwise a "kill" would mean nothing).

The scratch copy lives in build/mutation/ (--scratch): tree/ holds the tracked files of the
working tree (copied only when changed, so timestamps and the build stay valid) and build/
a CMake build of the module and the C++ tests, reused between runs. Each mutant edits one
file in tree/ and restores it afterwards; mutants are run file by file so each rebuild
compiles one translation unit. With --jobs N, worker k > 0 has its own copy and build in
worker<k>/ beside them, and the files are dealt out so that no two workers mutate the same
file (their estimated times balanced).

The catalogue format, and how an entry is located when code moves: tools/mutation_catalogue.py.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import time
import threading
from pathlib import Path
from typing import Dict, List, Optional

# The catalogue module lives beside this script (also when a test loads this file by path).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutation_catalogue import CATALOGUE, ROOT, Mutant, load_catalogue, resolve, tracked_files  # noqa: E402


def sync_tree(tree: Path) -> int:
    """Copies the working tree's tracked files into `tree`, only those whose bytes differ
    (unchanged files keep their timestamps, so the build stays incremental)."""
    changed = 0
    for rel in tracked_files():
        src = ROOT / rel
        if not src.is_file():
            continue  # deleted in the working tree
        dst = tree / rel
        data = src.read_bytes()
        if dst.is_file() and dst.read_bytes() == data:
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(data)
        shutil.copymode(src, dst)
        changed += 1
    return changed


MODULE_TARGET = "_core"  # the CMake target of the Python extension; each ctest name is its binary's target


class Runner:
    def __init__(self, scratch: Path, timeout: float, verbose: bool, build_jobs: int):
        self.scratch = scratch
        self.build_jobs = build_jobs  # compile jobs of this worker's builds
        self.tree = scratch / "tree"
        self.build = scratch / "build"
        self.timeout = timeout
        self.verbose = verbose
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FASTCOPY_")}
        self.env["PYTHONPATH"] = str(self.tree / "src")
        self.env["PYTHONDONTWRITEBYTECODE"] = "1"
        self.env["FASTCOPY_MUTATION_CHECK"] = "1"  # the model tests skip shrinking (tests/_models.py)
        # kernel_tests ends at its first failed check: a mutant of ops.h fails in the first
        # kernel, and the rest of the matrix would change nothing (evidence:
        # testing-mutation-per-mutant-costs).
        self.env["KERNEL_TESTS_STOP_AT_FIRST_FAILURE"] = "1"
        self.configured = False

    def log(self, text: str) -> None:
        if self.verbose:
            say(text)

    def configure(self) -> None:
        import pybind11  # the build needs it; imported here so --list works without it

        # -O1 and no LTO: a mutant's rebuild is one translation unit and a plain link. With
        # pybind11's default LTO the link re-optimises the whole module for every mutant; measured
        # on the 2-vCPU dev VM, bindings.cpp alone took 7.6 s of CPU at -O3 and 5.2 s at -O1.
        # The check tests the tests, so the optimisation level of the scratch build does not matter.
        cmd = ["cmake", "-S", str(self.tree), "-B", str(self.build), "-DCMAKE_BUILD_TYPE=Release",
               "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG", "-DCMAKE_INTERPROCEDURAL_OPTIMIZATION=OFF",
               "-DFASTCOPY_BUILD_MODULE=ON", "-DFASTCOPY_BUILD_TESTS=ON",
               f"-DPython_EXECUTABLE={sys.executable}", f"-Dpybind11_DIR={pybind11.get_cmake_dir()}"]
        if shutil.which("ninja"):
            cmd += ["-G", "Ninja"] if not (self.build / "CMakeCache.txt").exists() else []
        if shutil.which("ccache"):
            cmd.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"cmake configure failed:\n{r.stdout}\n{r.stderr}")
        self.configured = True

    def build_targets(self, targets: Optional[List[str]] = None) -> Optional[str]:
        """Builds `targets` (None: every target), and installs the module into tree/src/fastcopy
        when it is one of them. Returns None, or the compiler's output on failure."""
        if not self.configured:
            self.configure()
        jobs = str(self.build_jobs)
        names = [] if targets is None else ["--target", *targets]
        r = subprocess.run(["cmake", "--build", str(self.build), "-j", jobs, *names], capture_output=True,
                           text=True)
        if r.returncode != 0:
            return (r.stdout + r.stderr)[-4000:]
        if targets is None or MODULE_TARGET in targets:
            pkg = self.tree / "src" / "fastcopy"
            for old in pkg.glob("_core*.so"):
                old.unlink()
            for so in self.build.glob("_core*.so"):
                shutil.copy2(so, pkg / so.name)
        return None

    def run_tests(self, m_pytest: List[str], m_ctest: List[str]) -> tuple[bool, str, bool]:
        """Runs the tests; returns (all passed, short description of what failed, timed out).

        The C++ tests go first: they take seconds, and a mutant that makes a Python test hang
        (a pool job that never completes) is then caught by them instead of by the timeout."""
        failures = []
        deadline = time.monotonic() + self.timeout
        if m_ctest:
            regex = "^(" + "|".join(m_ctest) + ")$"
            cmd = ["ctest", "--test-dir", str(self.build), "-R", regex, "--output-on-failure",
                   "--no-tests=error"]
            try:
                r = subprocess.run(cmd, env=self.env, capture_output=True, text=True,
                                   timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False, "ctest timed out", True
            if r.returncode != 0:
                if "No tests were found" in r.stdout + r.stderr:
                    raise SystemExit(f"ctest found no test matching {regex}")
                failures.append("ctest " + ",".join(m_ctest))
                self.log(r.stdout[-3000:])
        if m_pytest and (not failures or self.verbose):
            # Without hypothesis's pytest plugin, which imports hypothesis in every run (most of a
            # one-test run's time: evidence testing-mutation-per-mutant-costs); the tests that use
            # hypothesis import it themselves.
            cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                   "-o", "addopts=", "--no-header", *m_pytest]
            try:
                r = subprocess.run(cmd, cwd=self.tree, env=self.env, capture_output=True, text=True,
                                   timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                if failures:
                    return False, "; ".join(failures), False
                return False, "pytest timed out", True
            if r.returncode == 5 or "no tests ran" in r.stdout:
                raise SystemExit(f"pytest collected no tests for {m_pytest}: the catalogue names a test that "
                                 f"does not exist\n{r.stdout[-2000:]}")
            if r.returncode != 0:
                failed = [ln.split(" ")[1] for ln in r.stdout.splitlines() if ln.startswith("FAILED ")]
                failures.append("pytest " + (failed[0] if failed else f"rc={r.returncode}"))
                self.log(r.stdout[-3000:] + r.stderr[-2000:])
        return not failures, "; ".join(failures), False


PRINT_LOCK = threading.Lock()


def say(text: str) -> None:
    with PRINT_LOCK:
        print(text, flush=True)


def prepare_scratch(runner: "Runner") -> tuple[int, Optional[str]]:
    """Syncs and builds one worker's scratch copy; returns (files updated, error or None)."""
    runner.tree.mkdir(parents=True, exist_ok=True)
    n_changed = sync_tree(runner.tree)
    err = runner.build_targets()
    if err:
        return n_changed, f"{err}\nthe unmutated tree in {runner.tree} does not build"
    check = subprocess.run([sys.executable, "-c", "import fastcopy; print(fastcopy.__file__)"], cwd=runner.tree,
                           env=runner.env, capture_output=True, text=True)
    if not check.stdout.strip().startswith(str(runner.tree)):
        return n_changed, (f"the scratch copy is not what the tests import: {check.stdout.strip()} "
                           f"{check.stderr[-500:]}")
    return n_changed, None


def force_profile(runner: "Runner", name: str) -> Optional[str]:
    """Writes the built-in profile `name`, as the unmutated scratch module resolves it for this
    CPU, to a file in the scratch folder and points the runner's FASTCOPY_PROFILE at it, so
    every test of every mutant runs under it. Returns None, or why it cannot."""
    code = ("import sys\nfrom fastcopy import _core\n"
            "names = [b['name'] for b in _core.builtin_profiles()]\n"
            "if sys.argv[1] not in names: sys.exit('no built-in profile ' + repr(sys.argv[1]) + '; the names: ' "
            "+ ', '.join(names))\n"
            "_core.use_builtin_profile(sys.argv[1])\nprint(_core.base_profile_json())\n")
    r = subprocess.run([sys.executable, "-c", code, name], cwd=runner.tree, env=runner.env, capture_output=True,
                       text=True)
    if r.returncode != 0:
        return f"--profile {name}: {r.stderr.strip()[-1000:]}"
    path = runner.scratch / f"profile-{name}.json"
    path.write_text(r.stdout)
    runner.env["FASTCOPY_PROFILE"] = str(path)
    return None


# Estimated seconds per mutant, from CI's sequential run of 152 mutants on the 2-vCPU Zen 3 VM
# (929 s): a C++ mutant averaged 6.5 s (a recompile, a link, its tests), a Python one 2.4 s.
ESTIMATED_SECONDS_CPP = 6.5
ESTIMATED_SECONDS_PY = 2.4


def deal_out(mutants: List[Mutant], jobs: int) -> List[List[Mutant]]:
    """Splits the mutants into `jobs` shares, whole files at a time (two workers never edit the
    same file, and each rebuild stays one translation unit), the largest files first to the
    least loaded share. Each share is ordered C++ first, file by file."""
    by_file: Dict[str, List[Mutant]] = {}
    for m in mutants:
        by_file.setdefault(m.file, []).append(m)

    def cost(ms: List[Mutant]) -> float:
        return sum(ESTIMATED_SECONDS_CPP if m.is_cpp else ESTIMATED_SECONDS_PY for m in ms)

    shares: List[List[Mutant]] = [[] for _ in range(jobs)]
    loads = [0.0] * jobs
    for file in sorted(by_file, key=lambda f: (-cost(by_file[f]), f)):
        k = loads.index(min(loads))
        shares[k].extend(by_file[file])
        loads[k] += cost(by_file[file])
    return [sorted(share, key=lambda m: (not m.is_cpp, m.file)) for share in shares]


def run_mutants(runner: "Runner", mutants: List[Mutant], stale: Dict[str, str]) -> Dict[str, str]:
    """Plants, builds and tests each mutant in turn in the runner's scratch copy."""
    results: Dict[str, str] = {}
    for m in mutants:
        t0 = time.monotonic()
        if m.name in stale:
            results[m.name] = "STALE"
            say(f"STALE     {m.name}: {stale[m.name]}")
            continue
        path = runner.tree / m.file
        original_text = path.read_text()
        try:
            assert original_text[m.offset:m.offset + len(m.original)] == m.original, m.name
            path.write_text(original_text[:m.offset] + m.replacement + original_text[m.offset + len(m.original):])
            if m.is_cpp:
                # Only what the mutant's tests run: the module for pytest, each named C++ test
                # binary for ctest (the other links, and the Python bindings' translation units
                # behind a changed header, would be built for nothing).
                err = runner.build_targets(([MODULE_TARGET] if m.pytest else []) + m.ctest)
                if err:
                    results[m.name] = "BROKEN"
                    say(f"BROKEN    {m.name}: the mutant does not compile\n{err[-1500:]}")
                    continue
            ok, what, timed_out = runner.run_tests(m.pytest, m.ctest)
        finally:
            path.write_text(original_text)
        dt = time.monotonic() - t0
        if ok:
            results[m.name] = "SURVIVED"
            say(f"SURVIVED  {m.name} ({dt:.0f} s): {m.why}; tests that passed: {' '.join(m.pytest + m.ctest)}")
        elif timed_out:
            # A hang is not a catch: the tests must end with a failure of their own (their waits
            # are bounded), or CI would wait for its own time limit.
            results[m.name] = "TIMEOUT"
            say(f"TIMEOUT   {m.name} ({dt:.0f} s): its tests did not end within {runner.timeout:.0f} s ({what})")
        else:
            results[m.name] = "killed"
            say(f"killed    {m.name} ({dt:.0f} s, by {what})")
    # Leave the scratch module unmutated for the next run's first build.
    if any(m.is_cpp for m in mutants):
        runner.build_targets()
    return results


SHM_DIR = "/dev/shm"


def shm_names() -> set:
    try:
        return set(os.listdir(SHM_DIR))
    except OSError:
        return set()


# Run by the Python that runs this check (fastcopy installed, or on PYTHONPATH): the names read
# on stdin that are stale fastcopy segments (creator gone, no end running) are removed.
_REMOVE_STALE = """
import json, os, sys
from fastcopy.shm import segments
names = set(json.load(sys.stdin))
for seg in segments.list_segments():
    if seg["stale"] and seg["name"] in names:
        try:
            os.unlink(os.path.join(segments._SEGMENT_DIR, seg["name"]))
            print(seg["name"])
        except OSError:
            pass
"""


def remove_stale_segments(new_names: set) -> int:
    """A planted bug can crash or hang a test before it removes its channel: of the /dev/shm
    names that appeared during the run, removes those that are stale fastcopy segments (nobody
    can use them). Returns how many."""
    if not new_names:
        return 0
    try:
        p = subprocess.run([sys.executable, "-c", _REMOVE_STALE], input=json.dumps(sorted(new_names)),
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return 0
    return len(p.stdout.split()) if p.returncode == 0 else 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="print the catalogue and exit")
    ap.add_argument("--only", action="append", metavar="NAME", help="run this mutant (repeatable, globs allowed)")
    ap.add_argument("--catalogue", type=Path, default=CATALOGUE,
                    help="a catalogue file or a folder of them (default tools/mutants/)")
    ap.add_argument("--scratch", type=Path, default=ROOT / "build" / "mutation",
                    help="scratch copy and build folder, reused between runs (default build/mutation)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds for one mutant's tests (default 300)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the run of the named tests on the unmutated tree")
    ap.add_argument("--stale-only", action="store_true", help="only check that every patch applies")
    ap.add_argument("--build-only", action="store_true",
                    help="only sync and build the scratch copies (a later run finds them built)")
    ap.add_argument("--jobs", type=int, default=1, metavar="N",
                    help="workers, each with its own scratch copy under --scratch (default 1)")
    ap.add_argument("-v", "--verbose", action="store_true", help="show test output of killed and surviving mutants")
    ap.add_argument("--profile", metavar="NAME",
                    help="run every test under this built-in dispatch profile (e.g. amd-zen3, amd-zen4, amd-zen5, "
                         "intel-erms-avx512; resolved for this CPU: kernels it lacks fall back per band) instead of "
                         "the one this CPU gets: the catalogue must pass under each CPU family's profile")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs must be at least 1, got {args.jobs}")

    mutants = load_catalogue(args.catalogue)
    if args.only:
        chosen = [m for m in mutants if any(fnmatch.fnmatchcase(m.name, pat) for pat in args.only)]
        if not chosen:
            ap.error(f"--only {' '.join(args.only)}: no such mutant (see --list)")
        mutants = chosen
    if args.list:
        for m in mutants:
            tests = m.pytest + [f"ctest:{t}" for t in m.ctest]
            print(f"{m.name:40s} {m.file:28s} {m.why}")
            print(f"{'':40s} caught by: {' '.join(tests)}")
        print(f"{len(mutants)} mutants")
        return 0

    t_start = time.monotonic()
    stale, moved = resolve(mutants, ROOT)
    if args.stale_only:
        for m in mutants:
            note = f": {stale[m.name]}" if m.name in stale else (f": found in {moved[m.name]}" if m.name in moved else "")
            print(f"{'STALE' if m.name in stale else 'ok':9s} {m.name}{note}")
        print(f"{len(mutants)} mutants, {len(stale)} stale, {len(moved)} found outside the file they name")
        return 1 if stale else 0

    jobs = min(args.jobs, len(mutants))
    build_jobs = max(1, (os.cpu_count() or 2) // jobs)
    scratch = args.scratch.resolve()
    runners = [Runner(scratch if k == 0 else scratch / f"worker{k}", args.timeout, args.verbose, build_jobs)
               for k in range(jobs)]
    # The scratch copies are built one after another, each with every CPU: the first compiles
    # everything, and with ccache the others find its objects in the cache (built side by side,
    # each would compile everything itself).
    for runner in runners:
        runner.build_jobs = os.cpu_count() or 2
        n_changed, err = prepare_scratch(runner)
        runner.build_jobs = build_jobs
        print(f"scratch tree {runner.tree} ({n_changed} files updated)", flush=True)
        if err:
            print(err)
            return 2
    print(f"built in {time.monotonic() - t_start:.0f} s", flush=True)
    if args.build_only:
        return 0
    if args.profile:
        for r in runners:
            err = force_profile(r, args.profile)
            if err:
                print(err)
                return 2
        print(f"tests run under the built-in profile {args.profile} (FASTCOPY_PROFILE={runners[0].env['FASTCOPY_PROFILE']})",
              flush=True)
    runner = runners[0]

    runnable = [m for m in mutants if m.name not in stale]
    if not args.no_baseline and runnable:
        t0 = time.monotonic()
        py = sorted({t for m in runnable for t in m.pytest})
        ct = sorted({t for m in runnable for t in m.ctest})
        ok, what, _ = runner.run_tests(py, ct)
        if not ok:
            runner.verbose = True
            runner.run_tests(py, ct)
            print(f"baseline FAILED ({what}): the named tests must pass on the unmutated tree")
            return 2
        print(f"baseline: {len(py)} pytest ids and {len(ct)} ctest names pass unmutated "
              f"({time.monotonic() - t0:.0f} s)", flush=True)

    results: Dict[str, str] = {}
    shm_before = shm_names()
    shares = deal_out(mutants, jobs)
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for part in pool.map(lambda rs: run_mutants(rs[0], rs[1], stale), zip(runners, shares)):
            results.update(part)
    removed = remove_stale_segments(shm_names() - shm_before)
    if removed:
        print(f"removed {removed} stale segments that the mutants' tests left in {SHM_DIR}")
    killed = sum(1 for v in results.values() if v == "killed")
    print(f"{len(mutants)} mutants, {killed} killed ({time.monotonic() - t_start:.0f} s)")
    bad = {k: v for k, v in results.items() if v != "killed"}
    if bad:
        print("not killed: " + ", ".join(f"{k} ({v})" for k, v in sorted(bad.items())))
        if any(v == "STALE" for v in bad.values()):
            print("STALE entries: the code changed under them; refresh `original`/`replacement` in "
                  f"{args.catalogue.relative_to(ROOT) if args.catalogue.is_relative_to(ROOT) else args.catalogue}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
