"""Run ``python -m fastcopy ...`` for the CLI tests.

A subprocess normally; in-process through ``fastcopy.__main__.main`` when FASTCOPY_NO_SUBPROCESS=1
(emulated interpreters, where starting another interpreter is too slow).
"""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional

import fastcopy

NO_SUBPROCESS = os.environ.get("FASTCOPY_NO_SUBPROCESS") == "1"
SRC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(fastcopy.__file__)))


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def cli(*args: str, env: Optional[dict] = None, timeout: float = 120) -> Result:
    if NO_SUBPROCESS:
        from fastcopy.__main__ import main

        out, err = io.StringIO(), io.StringIO()
        old = {k: os.environ.get(k) for k in (env or {})}
        os.environ.update(env or {})
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    rc = main(list(args))
                except SystemExit as e:
                    rc = e.code if isinstance(e.code, int) else 1
        finally:
            fastcopy.set_threads(0)  # main() may have set --threads; subprocess runs would not leak it
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        return Result(rc, out.getvalue(), err.getvalue())
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FASTCOPY_")}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC_DIR, os.environ.get("PYTHONPATH")) if p)
    full_env.update(env or {})
    p = subprocess.run([sys.executable, "-m", "fastcopy", *args], env=full_env, capture_output=True, text=True,
                       timeout=timeout)
    return Result(p.returncode, p.stdout, p.stderr)
