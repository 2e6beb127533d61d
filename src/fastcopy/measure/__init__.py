"""Measurement for ``python -m fastcopy bench`` and ``python -m fastcopy tune``: one engine
(``engine``: buffers, cache modes, timing, interleaving, medians, spreads; ``system``: machine
facts), its formatting (``report``), the bench command line (``cli``) and the tuner (``tune``).
Imported only by those commands: ``import fastcopy`` does not load it."""
