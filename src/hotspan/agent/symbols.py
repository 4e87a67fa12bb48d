"""Naming frames: a code object and offset become ``module.qualname``, file and line."""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Dict, Optional, Tuple

    FrameInfo = Tuple[str, str, int, int]  # name, filename, line, first line of the function


UNKNOWN: FrameInfo = ("<unknown>", "", 0, 0)
MAX_CACHED = 100_000


class Symbolizer:
    def __init__(self) -> None:
        self._names: Dict[Any, Tuple[str, str, int]] = {}
        self._lines: Dict[Tuple[Any, int], int] = {}
        self._modules: Dict[str, str] = {}
        self._modules_size = -1

    def frame(self, code: Optional[Any], lasti: int) -> FrameInfo:
        if code is None:
            return UNKNOWN
        named = self._names.get(code)
        if named is None:
            if len(self._names) > MAX_CACHED:
                self._names.clear()
            qualname = getattr(code, "co_qualname", None) or code.co_name
            module = self._module_of(code.co_filename)
            named = (
                f"{module}.{qualname}" if module else qualname,
                code.co_filename,
                code.co_firstlineno,
            )
            self._names[code] = named
        key = (code, lasti)
        line = self._lines.get(key)
        if line is None:
            if len(self._lines) > MAX_CACHED:
                self._lines.clear()
            line = _line_of(code, lasti)
            self._lines[key] = line
        return named[0], named[1], line, named[2]

    def _module_of(self, filename: str) -> str:
        if filename.startswith("<"):
            return ""  # <string>, <frozen ...>: no file, no module to name
        module = self._modules.get(filename)
        if module is None and len(sys.modules) != self._modules_size:
            self._index_modules()
            module = self._modules.get(filename)
        if module is None:
            module = os.path.splitext(os.path.basename(filename))[0]
            self._modules[filename] = module
        return module

    def _index_modules(self) -> None:
        # Rebuilt only when modules were imported since the last time: a file maps to the
        # name it was imported as (``__main__`` for the script).
        self._modules_size = len(sys.modules)
        for name, module in list(sys.modules.items()):
            filename = getattr(module, "__file__", None)
            if not isinstance(filename, str):
                continue
            if filename.endswith((".pyc", ".pyo")):
                filename = filename[:-1]
            self._modules.setdefault(filename, name)
            self._modules.setdefault(os.path.abspath(filename), name)


def _line_of(code: Any, lasti: int) -> int:
    if hasattr(code, "co_positions"):
        # 3.11+: positions per code unit; one lookup is cheaper than scanning co_lines.
        index = lasti // 2
        for i, position in enumerate(code.co_positions()):
            if i == index:
                return position[0] or code.co_firstlineno
        return code.co_firstlineno
    if not hasattr(code, "co_lines"):
        # 3.9: no co_lines; dis.findlinestarts reads co_lnotab (offsets increase).
        import dis

        line = code.co_firstlineno
        for offset, lineno in dis.findlinestarts(code):
            if offset > lasti:
                break
            line = lineno
        return line
    for start, end, line in code.co_lines():
        if start <= lasti < end:
            return line if line is not None else code.co_firstlineno
    return code.co_firstlineno
