"""The installed package: type stubs cover the extension, public names are documented."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import fastcopy
from fastcopy import _core

PKG = Path(fastcopy.__file__).parent


def stub_names(path: Path) -> set:
    tree = ast.parse(path.read_text())
    names = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    # module constants: `NAME: int`
    names |= {node.target.id for node in tree.body
              if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}
    return names


def test_py_typed_and_stubs_ship():
    assert (PKG / "py.typed").exists()
    assert (PKG / "_core.pyi").exists()


def test_core_stub_matches_module():
    public = {n for n in dir(_core) if not n.startswith("__")}
    assert stub_names(PKG / "_core.pyi") == public


def test_public_names_have_docstrings():
    for name in fastcopy.__all__:
        obj = getattr(fastcopy, name)
        if name == "__version__":
            assert isinstance(obj, str)
            continue
        assert inspect.getdoc(obj), name
    import fastcopy.shm as shm

    for name in getattr(shm, "__all__", []):
        assert inspect.getdoc(getattr(shm, name)), f"shm.{name}"


def test_dir_lists_the_public_api_only():
    # Tab completion shows what dir() returns: the public names, not typing or module imports.
    import fastcopy.shm as shm

    for module in (fastcopy, shm):
        assert dir(module) == sorted(module.__all__), module.__name__
        for name in dir(module):
            getattr(module, name)  # every listed name resolves
        for hidden in ("Any", "annotations", "np", "os"):
            assert hidden not in dir(module)
