"""Optional C fast paths.  Import through :func:`load`, which returns None when the
extension is not built (or ``HOTSPAN_NO_SPEEDUPS=1``), so that callers fall back to Python."""

from __future__ import annotations

import os
from types import ModuleType

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Optional


def speedups_disabled() -> bool:
    """``HOTSPAN_NO_SPEEDUPS`` is set: the pure-Python paths were asked for."""
    return bool(os.environ.get("HOTSPAN_NO_SPEEDUPS"))


def load() -> Optional[ModuleType]:
    if speedups_disabled():
        return None
    try:
        from hotspan._speedups import _pprof
    except ImportError:
        return None
    return _pprof


def load_sampler() -> Optional[ModuleType]:
    """The native sampler, or None (pure-Python sampler) when absent or disabled."""
    if speedups_disabled():
        return None
    try:
        from hotspan._speedups import _sampler
    except ImportError:
        return None
    return _sampler


def native_unavailable_reason() -> str:
    """Why :func:`load_sampler` gives None here, in words for a log line."""
    import sys

    if speedups_disabled():
        return "HOTSPAN_NO_SPEEDUPS is set"
    if not sys.platform.startswith("linux"):
        return f"the native sampler is Linux-only (this is {sys.platform})"
    try:
        from hotspan._speedups import _sampler  # noqa: F401
    except ImportError as exc:
        return f"the C extension is not built or does not load ({exc})"
    return "the native sampler is available"


def load_module(name: str) -> Optional[ModuleType]:
    """A collector's C module (``_alloc``, ``_locks``), or None when absent or disabled."""
    if speedups_disabled():
        return None
    try:
        import importlib

        return importlib.import_module(f"hotspan._speedups.{name}")
    except ImportError:
        return None
