#!/usr/bin/env python3
"""Mutation check: plants each bug of the catalogue tools/mutants/ in a scratch copy of the tree,
rebuilds incrementally, runs only the tests the catalogue names for it and reports whether
they caught it.

    python tools/mutation_check.py              # every mutant
    python tools/mutation_check.py --list       # the catalogue
    python tools/mutation_check.py --only NAME  # one mutant (repeatable; shell globs allowed)
    python tools/mutation_check.py --stale-only # only check that every patch still applies
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

Where an entry points: `file`, and optionally `function`, the name of the function (C++ or
Python) whose body holds the snippet. A snippet is looked for in `file` first; when it is not
there exactly once (the file was moved or split), in every tracked file of the same kind
(suffix). With `function`, only occurrences inside a definition of that function count, so
code can move between files and a snippet may repeat elsewhere in the tree. A pytest id whose
file moved is found by its file name under tests/. `--stale-only` says where each moved entry
was found.

Refreshing a STALE entry: open the file, find the code the entry describes (its `name` and
`why` say which decision), and copy the current text into `original` and the bug into
`replacement`; `--only NAME` then checks it alone.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
import threading
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = ROOT / "tools" / "mutants"  # one TOML file per module
CPP_SUFFIXES = (".cpp", ".h", ".hpp", ".cc")


@dataclass
class Mutant:
    name: str
    file: str
    original: str
    replacement: str
    why: str
    pytest: List[str] = field(default_factory=list)
    ctest: List[str] = field(default_factory=list)
    function: Optional[str] = None
    offset: int = -1  # where `original` starts in `file`, once located

    @property
    def is_cpp(self) -> bool:
        return self.file.endswith(CPP_SUFFIXES) or self.file.endswith("CMakeLists.txt")


KEYS = {"name", "file", "original", "replacement", "why", "pytest", "ctest", "function"}


def catalogue_files(path: Path) -> List[Path]:
    """The catalogue is one TOML file or a folder of them (one per module, read in name order)."""
    if path.is_dir():
        files = sorted(path.glob("*.toml"))
        if not files:
            raise SystemExit(f"{path}: no *.toml catalogue in this folder")
        return files
    return [path]


def load_catalogue(path: Path) -> List[Mutant]:
    mutants: List[Mutant] = []
    seen: set = set()
    for file in catalogue_files(path):
        mutants += load_catalogue_file(file, seen)
    return mutants


def load_catalogue_file(path: Path, seen: set) -> List[Mutant]:
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    mutants: List[Mutant] = []
    for i, entry in enumerate(doc.get("mutant", [])):
        missing = [k for k in ("name", "file", "original", "replacement", "why") if k not in entry]
        if missing:
            raise SystemExit(f"{path}: mutant #{i + 1} lacks {', '.join(missing)}")
        unknown = set(entry) - KEYS
        if unknown:
            raise SystemExit(f"{path}: mutant {entry['name']}: unknown keys {sorted(unknown)}")
        if entry["name"] in seen:
            raise SystemExit(f"{path}: duplicate mutant name {entry['name']}")
        seen.add(entry["name"])
        m = Mutant(entry["name"], entry["file"], entry["original"], entry["replacement"], entry["why"],
                   list(entry.get("pytest", [])), list(entry.get("ctest", [])), entry.get("function"))
        if not m.pytest and not m.ctest:
            raise SystemExit(f"{path}: mutant {m.name} names no test (pytest or ctest) that should catch it")
        if m.original == m.replacement:
            raise SystemExit(f"{path}: mutant {m.name}: replacement equals original")
        mutants.append(m)
    return mutants


def _skip_literal(text: str, i: int) -> int:
    """Index after the C++ comment or string/char literal starting at i (i itself if none)."""
    if text.startswith("//", i):
        j = text.find("\n", i)
        return len(text) if j < 0 else j
    if text.startswith("/*", i):
        j = text.find("*/", i + 2)
        return len(text) if j < 0 else j + 2
    if text[i] in "\"'":
        quote, j = text[i], i + 1
        while j < len(text) and text[j] != quote and text[j] != "\n":
            j += 2 if text[j] == "\\" else 1
        return j + 1
    return i


def _cpp_bodies(text: str, name: str) -> List[tuple]:
    """(start, end) of the body of each C++ function definition named `name` (also Class::name):
    the name, a balanced parameter list, then `{` before any `;`, then the matching `}`."""
    spans = []
    for m in re.finditer(r"(?<![\w.>])(?:\w+::)*" + re.escape(name) + r"\s*\(", text):
        i, depth = m.end(), 1
        while i < len(text) and depth:  # the parameter list
            j = _skip_literal(text, i)
            if j != i:
                i = j
                continue
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        initialisers = False  # after a constructor's single ':'
        while i < len(text) and text[i] != ";":  # const, noexcept, -> type, initialisers
            j = _skip_literal(text, i)
            if j != i:
                i = j
                continue
            if text[i] == ":" and text[i - 1] != ":" and text[i + 1:i + 2] != ":":
                initialisers = True
            prev = text[:i].rstrip()[-1:]
            if text[i] == "(" or (text[i] == "{" and initialisers and (prev.isalnum() or prev in "_>")):
                close = {"(": ")", "{": "}"}[text[i]]  # a member initialiser: m_(x) or m_{x}
                opener, depth = text[i], 1
                i += 1
                while i < len(text) and depth:
                    depth += {opener: 1, close: -1}.get(text[i], 0)
                    i += 1
                continue
            if text[i] == "{":
                break
            i += 1
        if i >= len(text) or text[i] == ";":
            continue  # a declaration or a call
        start, depth = i, 0
        while i < len(text):
            j = _skip_literal(text, i)
            if j != i:
                i = j
                continue
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
            if depth == 0:
                break
        spans.append((start, i))
    return spans


def _py_bodies(text: str, name: str) -> List[tuple]:
    """(start, end) of each Python `def name` / `class name`: up to the next line indented no
    deeper than the definition."""
    spans = []
    for m in re.finditer(r"^([ \t]*)(?:async[ \t]+)?(?:def|class)[ \t]+" + re.escape(name) + r"\b", text, re.M):
        indent = len(m.group(1))
        first_line_end = text.find("\n", m.end())
        rest = len(text) if first_line_end < 0 else first_line_end + 1
        end = len(text)
        for line in re.finditer(r"^([ \t]*)(\S)", text[rest:], re.M):
            if len(line.group(1)) <= indent and line.group(2) not in "#)":
                end = rest + line.start()
                break
        spans.append((m.start(), end))
    return spans


def occurrences(m: Mutant, text: str, file: str) -> List[int]:
    """Offsets of `original` in `text`, inside `function` when the entry names one."""
    found, i = [], text.find(m.original)
    while i >= 0:
        found.append(i)
        i = text.find(m.original, i + 1)
    if m.function is None:
        return found
    bodies = (_py_bodies if file.endswith(".py") else _cpp_bodies)(text, m.function)
    return [i for i in found if any(a <= i and i + len(m.original) <= b for a, b in bodies)]


def locate(m: Mutant, tree: Path, files: Optional[List[str]] = None) -> tuple:
    """Finds where the entry's snippet is: (file, offset, None), or (None, -1, why it is stale).
    `file` first; if the snippet is not there exactly once, every file of the same suffix."""
    path = tree / m.file
    if path.is_file():
        hits = occurrences(m, path.read_text(), m.file)
        if len(hits) == 1:
            return m.file, hits[0], None
        if len(hits) > 1:
            where = f" in {m.function}()" if m.function else ""
            return None, -1, f"original snippet found {len(hits)} times{where} in {m.file} (must be exactly once)"
    suffix = Path(m.file).suffix or Path(m.file).name
    hits = []
    for rel in files if files is not None else tracked_files():
        if rel == m.file or not (rel.endswith(suffix)) or not (tree / rel).is_file():
            continue
        hits += [(rel, i) for i in occurrences(m, (tree / rel).read_text(errors="replace"), rel)]
    if len(hits) == 1:
        return hits[0][0], hits[0][1], None
    where = f" in {m.function}()" if m.function else ""
    here = "does not exist" if not path.is_file() else f"has the original snippet{where} 0 times"
    if not hits:
        return None, -1, f"{m.file} {here}, and no other *{suffix} file has it"
    return None, -1, (f"{m.file} {here}; found {len(hits)} times elsewhere: "
                      + ", ".join(sorted({f for f, _ in hits})) + " (name `function` to choose)")


def stale_reason(m: Mutant, tree: Path) -> Optional[str]:
    return locate(m, tree)[2]


def resolve_test_id(test_id: str, tree: Path) -> str:
    """A pytest id whose file moved under tests/ is found by its file name (when unique)."""
    file, sep, rest = test_id.partition("::")
    if (tree / file).is_file():
        return test_id
    found = sorted((tree / "tests").rglob(Path(file).name))
    if len(found) == 1:
        return str(found[0].relative_to(tree)) + sep + rest
    return test_id


def missing_test(test_id: str, tree: Path) -> Optional[str]:
    """Why `test_id` names no test in the tree (its file, or a `def` of its function there),
    else None: a missing id would make pytest fail to collect, which must not count as a kill."""
    file, _, rest = test_id.partition("::")
    path = tree / file
    if not path.is_file():
        return f"names {test_id}, whose file does not exist"
    func = rest.split("::")[-1].split("[")[0] if rest else ""
    # a def, or a name bound at module level (a hypothesis state machine's TestCase)
    pattern = rf"^\s*(async\s+)?def {re.escape(func)}\(|^{re.escape(func)}\s*="
    if func and not re.search(pattern, path.read_text(), re.M):
        return f"names {test_id}: no test {func} in {file}"
    return None


def resolve(mutants: List[Mutant], tree: Path) -> tuple:
    """Points each entry at where its snippet is now (file, offset) and its tests at their files.
    Returns ({name: why stale}, {name: file it moved to})."""
    stale, moved = {}, {}
    files = tracked_files()
    for m in mutants:
        file, offset, why = locate(m, tree, files)
        if why is not None:
            stale[m.name] = why
            continue
        if file != m.file:
            moved[m.name] = file
        m.file, m.offset = file, offset
        m.pytest = [resolve_test_id(t, tree) for t in m.pytest]
        missing = [why for why in (missing_test(t, tree) for t in m.pytest) if why]
        if missing:
            stale[m.name] = "; ".join(missing)
    return stale, moved


def tracked_files() -> List[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    return [p for p in out.decode().split("\0") if p]


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

    def build_all(self, module_only: bool = False) -> Optional[str]:
        """Builds the module and (unless module_only) the C++ tests; installs the module into
        tree/src/fastcopy. Returns None, or the compiler's output on failure."""
        if not self.configured:
            self.configure()
        jobs = str(self.build_jobs)
        target = ["--target", "_core"] if module_only else []
        r = subprocess.run(["cmake", "--build", str(self.build), "-j", jobs, *target], capture_output=True,
                           text=True)
        if r.returncode != 0:
            return (r.stdout + r.stderr)[-4000:]
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
            cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                   "--no-header", *m_pytest]
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
    err = runner.build_all()
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
                err = runner.build_all(module_only=not m.ctest)  # no C++ test to run: skip their links
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
        runner.build_all()
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
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        prepared = list(pool.map(prepare_scratch, runners))
    for runner, (n_changed, err) in zip(runners, prepared):
        print(f"scratch tree {runner.tree} ({n_changed} files updated)", flush=True)
        if err:
            print(err)
            return 2
    print(f"built in {time.monotonic() - t_start:.0f} s", flush=True)
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
