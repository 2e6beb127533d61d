"""Starting child Python processes from the tests: one place for the environment they get, how a
scenario script is written and run, what a failure report shows, the shared-memory segments the
scenarios leave behind, and the failure-modes tables of the docs that scenarios check row by row.

Children import the same fastcopy as this process (CI installs it; a developer's src/ holds the
module built in place), so SRC goes first on their PYTHONPATH."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Set

import fastcopy

SRC = str(Path(fastcopy.__file__).resolve().parent.parent)

# Starts the command after it with SIGINT ignored, as a script's `cmd &` or a non-interactive
# job does: an ignored SIGINT is inherited across exec, and Python then installs no handler of
# its own. The Ctrl-C scenarios run under it, so they pass only because each sets the handler
# it relies on (SIGINT_HANDLER), however pytest itself was started.
SIGINT_IGNORED = (sys.executable, "-c",
                  "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                  "os.execv(sys.argv[1], sys.argv[1:])")

# The first lines of a scenario that sends itself SIGINT: Python's own handler
# (KeyboardInterrupt), whatever the process inherited.
SIGINT_HANDLER = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"


def child_env(**extra: str) -> dict:
    """This process's environment with SRC first on PYTHONPATH, plus `extra`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def run_script(tmp_path: Path, code: str, *args: str, timeout: float = 60.0, prefix: Sequence[str] = (),
               env: Optional[dict] = None, name: str = "scenario.py") -> subprocess.CompletedProcess:
    """Writes `code` (dedented) to tmp_path/name and runs it with `args` in tmp_path, output
    captured; `prefix` goes before the interpreter (SIGINT_IGNORED, an emulator). A run past
    `timeout` raises subprocess.TimeoutExpired, which fails the test."""
    script = tmp_path / name
    script.write_text(textwrap.dedent(code))
    return subprocess.run([*prefix, sys.executable, str(script), *args], capture_output=True, text=True,
                          timeout=timeout, env=env or child_env(), cwd=str(tmp_path))


def spawn(code: str, *args: str, env: Optional[dict] = None) -> subprocess.Popen:
    """Starts `code` (dedented) with `args`, stdout and stderr piped as text."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env or child_env())


def explain(proc) -> str:
    """A finished child's exit status and output, for an assertion message."""
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"


# ---- segments in /dev/shm -------------------------------------------------------------------
# Each test file names its segments with a prefix of its own and the pytest process id, so that
# what a test left behind is found (and removed) by that prefix.
SEGMENT_DIR = "/dev/shm"


def shm_names(prefix: str) -> Set[str]:
    """The names in /dev/shm that start with ``prefix``."""
    return {n for n in os.listdir(SEGMENT_DIR) if n.startswith(prefix)}


def name_maker(prefix: str) -> Callable[..., str]:
    """fresh_name(tag="") -> a name under ``prefix`` that this process has not given before."""
    counter = itertools.count(1)

    def fresh_name(tag: str = "") -> str:
        n = next(counter)
        return f"{prefix}{tag}-{n}" if tag else f"{prefix}{n}"

    return fresh_name


def remove_segments(prefix: str) -> List[str]:
    """Removes the names in /dev/shm that start with ``prefix`` (files, links, FIFOs, empty
    directories); returns them, sorted."""
    left = sorted(shm_names(prefix))
    for name in left:
        path = os.path.join(SEGMENT_DIR, name)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass
    return left


def leftovers_fixture(prefix: str, fail: bool):
    """An autouse fixture for a test file: after each test it removes the segments under
    ``prefix`` and, with ``fail``, fails the test that left any. Without ``fail`` it only
    removes them: a scenario that fails half way (under a planted bug of the mutation check, say)
    leaves its segments behind, and the tests that pass have asserted that they leave none."""
    import pytest

    @pytest.fixture(autouse=True)
    def no_leftovers():
        yield
        left = remove_segments(prefix)
        assert not (fail and left), f"test left segments in /dev/shm: {left}"

    return no_leftovers


# ---- the "Failure modes" tables of the docs ------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]


def failure_table(doc: str) -> Dict[str, str]:
    """{fault: what the caller gets} from the '## Failure modes' table of docs/<doc>."""
    text = (ROOT / "docs" / doc).read_text()
    section = text.split("## Failure modes", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and line.startswith("|") and cells[0] not in ("fault", "---"):
            rows[cells[0]] = cells[1]
    return rows


def raised(fn: Callable[[], object]) -> str:
    """The name of the exception type fn() raises, or "nothing"."""
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - the type is the outcome
        return type(e).__name__
    return "nothing"


def check_failure_cell(outcome: str, cell: str) -> None:
    """Every word of the observed outcome must be in the documented cell (backticks ignored)."""
    plain = cell.replace("`", "")
    missing = [w for w in outcome.split() if w not in plain]
    assert not missing, f"observed {outcome!r}, documented {cell!r}"
