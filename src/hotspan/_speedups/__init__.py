"""Optional C fast paths.  Import through :func:`load`, which returns None when the
extension is not built (or ``HOTSPAN_NO_SPEEDUPS=1``), so that callers fall back to Python."""

from __future__ import annotations

import os
from types import ModuleType

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Optional


def load() -> Optional[ModuleType]:
    if os.environ.get("HOTSPAN_NO_SPEEDUPS"):
        return None
    try:
        from hotspan._speedups import _pprof
    except ImportError:
        return None
    return _pprof


def load_sampler() -> Optional[ModuleType]:
    """The native sampler, or None (pure-Python sampler) when absent or disabled."""
    if os.environ.get("HOTSPAN_NO_SPEEDUPS"):
        return None
    try:
        from hotspan._speedups import _sampler
    except ImportError:
        return None
    return _sampler


def load_module(name: str) -> Optional[ModuleType]:
    """A collector's C module (``_alloc``, ``_locks``), or None when absent or disabled."""
    if os.environ.get("HOTSPAN_NO_SPEEDUPS"):
        return None
    try:
        import importlib

        return importlib.import_module(f"hotspan._speedups.{name}")
    except ImportError:
        return None
