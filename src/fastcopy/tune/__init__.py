"""Measuring the dispatch profile on this machine: ``check`` (``python -m fastcopy tune --check``,
``fastcopy.check_dispatch()``)."""
