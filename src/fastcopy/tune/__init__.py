"""``python -m fastcopy tune``: measure this machine and write a dispatch profile.

- ``measure``: the size grid and the timing of every cell (through ``fastcopy.bench.engine``);
- ``decide``: pure functions from the measurements to bands, thresholds and the profile's body;
- ``profile``: the built-in choices measured against, building, checking (the loader's own
  validator), writing and reading the profile file, and ``tune()``;
- ``cli``: the command line.

Imported only by ``fastcopy.tune()`` and the command: ``import fastcopy`` does not load it.
Once imported, this package is the attribute ``fastcopy.tune``; it stays callable as the
function it replaces there (``fastcopy.tune(quick=True)`` runs ``profile.tune``).
"""

import sys
import types
from typing import Any, Dict


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Dict[str, Any]:
        from .profile import tune

        return tune(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
