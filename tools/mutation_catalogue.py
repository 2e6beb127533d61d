"""The mutation catalogue (tools/mutants/*.toml): loading its entries and finding where each
one's snippet is in the tree, for tools/mutation_check.py.

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

import re
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

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


def _past_closing(text: str, i: int, opener: str, closer: str) -> int:
    """The index just past the `closer` that closes an `opener` already open before `i`
    (string and character literals skipped); len(text) when there is none."""
    depth = 1
    while i < len(text) and depth:
        j = _skip_literal(text, i)
        if j != i:
            i = j
            continue
        depth += {opener: 1, closer: -1}.get(text[i], 0)
        i += 1
    return i


def _cpp_bodies(text: str, name: str) -> List[tuple]:
    """(start, end) of the body of each C++ function definition named `name` (also Class::name):
    the name, a balanced parameter list, then `{` before any `;`, then the matching `}`."""
    spans = []
    for m in re.finditer(r"(?<![\w.>])(?:\w+::)*" + re.escape(name) + r"\s*\(", text):
        i = _past_closing(text, m.end(), "(", ")")  # the parameter list
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
                # a member initialiser: m_(x) or m_{x}
                i = _past_closing(text, i + 1, text[i], {"(": ")", "{": "}"}[text[i]])
                continue
            if text[i] == "{":
                break
            i += 1
        if i >= len(text) or text[i] == ";":
            continue  # a declaration or a call
        spans.append((i, _past_closing(text, i + 1, "{", "}")))
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
