"""Starting child Python processes from the tests: one place for the environment they get, how a
scenario script is written and run, and what a failure report shows.

Children import the same fastcopy as this process (CI installs it; a developer's src/ holds the
module built in place), so SRC goes first on their PYTHONPATH."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Optional, Sequence

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
