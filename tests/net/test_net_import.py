"""Import discipline: importing fastcopy (and its command line) never imports zenoh, and a missing
zenoh gives an ImportError that names the extra."""
from __future__ import annotations

import pytest

from _child import explain, run_script
from conftest import no_subprocess

pytestmark = [pytest.mark.net, no_subprocess]


def test_import_fastcopy_does_not_import_zenoh(tmp_path):
    proc = run_script(tmp_path, """
        import sys
        import fastcopy, fastcopy.shm, fastcopy.__main__, fastcopy.net
        fastcopy.__main__._build_parser()
        print(sorted(m for m in sys.modules if m.split(".")[0] == "zenoh"))
    """)
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.strip() == "[]", explain(proc)


def test_missing_zenoh_names_the_extra(tmp_path):
    proc = run_script(tmp_path, """
        import sys
        sys.modules["zenoh"] = None  # what an environment without eclipse-zenoh looks like to import
        import fastcopy.net
        try:
            fastcopy.net.Publisher("k")
        except ImportError as exc:
            print("ImportError:", exc)
    """)
    assert proc.returncode == 0, explain(proc)
    assert "ImportError:" in proc.stdout and "fastcopy[net]" in proc.stdout, explain(proc)


def test_bridge_command_without_zenoh_says_what_to_install(tmp_path):
    proc = run_script(tmp_path, """
        import sys
        sys.modules["zenoh"] = None
        from fastcopy.__main__ import main
        sys.exit(main(["bridge", "--topic", "t", "--key", "k"]))
    """)
    assert proc.returncode == 2, explain(proc)
    assert "fastcopy[net]" in proc.stdout, explain(proc)
