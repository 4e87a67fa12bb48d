"""Naming frames: a code object and offset become ``module.qualname``, file and line."""

from __future__ import annotations

import os
import sys
from bisect import bisect_right

from hotspan._speedups import load_module

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Callable, Dict, List, Optional, Set, Tuple

    FrameInfo = Tuple[str, str, int, int]  # name, filename, line, first line of the function


UNKNOWN: FrameInfo = ("<unknown>", "", 0, 0)
# What a hidden frame is named, to be taken out of its stack (compared by identity).
HIDDEN: FrameInfo = ("<hotspan>", "", 0, 0)
# The one frame a stack of hotspan's own work becomes (compared by identity when naming).
AGENT: FrameInfo = ("hotspan", "", 0, 0)
# The frame a sample taken while CPython's cyclic collector ran ends in (the native sampler's
# synthetic frame, GC_FRAME_CODE in _speedups/sampler), one per generation collected (0, 1,
# 2, then unknown): equal tuples, told apart by identity, so that the flame graph has one
# [GC] bar and the generation goes in a label (see gc_generation).
GC_FRAME_NAME = "[GC]"
GC_GENERATION_LABEL = "gc_generation"


def _new_gc_frame() -> FrameInfo:
    return (GC_FRAME_NAME, "", 0, 0)  # built at each call: a new object


GC_FRAMES: Tuple[FrameInfo, ...] = tuple(_new_gc_frame() for _ in range(4))


def gc_frame(generation: int) -> FrameInfo:
    """The [GC] frame of a collection of ``generation`` (another number: unknown)."""
    return GC_FRAMES[generation if 0 <= generation < 3 else 3]


def gc_generation(stack: Tuple[FrameInfo, ...]) -> Optional[str]:
    """The generation a stack's [GC] leaf frame stands for ("" when unknown), or None when the
    stack does not end in one."""
    leaf = stack[0] if stack else None
    if leaf is None or leaf[0] != GC_FRAME_NAME:
        return None
    for generation, frame in enumerate(GC_FRAMES[:3]):
        if leaf is frame:
            return str(generation)
    return ""


# Code objects of the agent that run inside the program's own calls (tag_wrapper's wrapper
# function): left out of stacks.  Code that is hotspan's work from the root of its stack
# (``hotspan run``'s start and exit in the program's main thread): the whole stack is one
# ``hotspan`` frame.  Either way hotspan's work never poses as the program's.
HIDDEN_CODE: Set[Any] = set()
AGENT_CODE: Set[Any] = set()


def hide_code(code: Any) -> None:
    """Leave frames of ``code`` out of every stack named from now on."""
    HIDDEN_CODE.add(code)


def hide_code_tree(code: Any) -> None:
    """:func:`hide_code` for ``code`` and every code object defined in it (closures,
    comprehensions, which are code objects of their own before 3.12)."""
    hide_code(code)
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            hide_code_tree(const)


def agent_code(code: Any) -> None:
    """Stacks through ``code`` (hotspan's own work from their root) become one ``hotspan``
    frame."""
    AGENT_CODE.add(code)


MAX_CACHED = 20_000  # code objects; each entry keeps its code object alive


class _Named:
    """What one code object is called, and its lines by offset (filled as offsets are seen).

    Holding the code object keeps its id from being reused by another while it is cached."""

    __slots__ = ("code", "name", "filename", "first_line", "lines", "line_table")

    def __init__(self, code: Any, name: str, filename: str) -> None:
        self.code = code
        self.name = name
        self.filename = filename
        self.first_line = code.co_firstlineno
        self.lines: Dict[int, FrameInfo] = {}
        self.line_table: Optional[Tuple[List[int], List[int]]] = None


_native = load_module("_symbols")


class Symbolizer:
    """``redact``: applied to each function and file name as it is first named."""

    def __init__(self, redact: Optional[Callable[[str], str]] = None) -> None:
        self._redact = redact
        # By id(code), not by the code object: in 3.11 hashing a code object hashes its
        # bytecode and constants again on every lookup (~600 instructions a frame).
        self._names: Dict[int, _Named] = {}
        self._modules: Dict[str, str] = {}
        self._modules_size = -1
        # (code, offset) -> frame, in C: an upload names each distinct stack it has, and in
        # Python every frame of it would cost a call (see _speedups/symbols.c).
        self._stacks = _native.FrameCache(self.frame, 4 * MAX_CACHED) if _native else None
        self._hidden_named = False

    def name_stack(self, stack: Any) -> Tuple[FrameInfo, ...]:
        """``stack``: (code object or None, byte offset) entries, or frames already named."""
        if self._stacks is not None:
            named = self._stacks.name_stack(stack)
        else:
            frame = self.frame
            named = tuple(
                entry if len(entry) == 4 else frame(entry[0], entry[1]) for entry in stack
            )
        # Only once a hidden frame was named: the other programs pay nothing for it.
        if self._hidden_named:
            if AGENT in named:
                return (AGENT,)
            if HIDDEN in named:
                named = tuple(f for f in named if f is not HIDDEN)
        return named

    def frame(self, code: Optional[Any], lasti: int) -> FrameInfo:
        if code is None:
            return UNKNOWN
        named = self._names.get(id(code))
        if named is None or named.code is not code:
            # Asked once per code object and offset (the frame cache keeps the answer).
            if code in HIDDEN_CODE or code in AGENT_CODE:
                self._hidden_named = True
                return HIDDEN if code in HIDDEN_CODE else AGENT
            if len(self._names) > MAX_CACHED:
                self._names.clear()
            qualname = getattr(code, "co_qualname", None) or code.co_name
            module = self._module_of(code.co_filename)
            name = f"{module}.{qualname}" if module else qualname
            filename = code.co_filename
            if self._redact is not None:
                name, filename = self._redact(name), self._redact(filename)
            named = _Named(code, name, filename)
            self._names[id(code)] = named
        info = named.lines.get(lasti)
        if info is None:
            info = (named.name, named.filename, _line_of(named, lasti), named.first_line)
            named.lines[lasti] = info
        return info

    def _module_of(self, filename: str) -> str:
        if filename.startswith("<"):
            return ""  # <string>, <frozen ...>: no file, no module to name
        module = self._modules.get(filename)
        if module is None and len(sys.modules) != self._modules_size:
            self._index_modules()
            module = self._modules.get(filename)
        if module is None:
            if _is_main_script(filename):
                module = "__main__"
            else:
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


def _is_main_script(filename: str) -> bool:
    """Whether ``filename`` is the program's main script, whose frames are ``__main__.*``
    however it was started (``python job.py``, ``-m job``, ``hotspan run``) and whenever
    they are first named.

    The index above finds it as ``__main__`` only while that module has a ``__file__``, and
    CPython deletes it when a script (not ``-m``) returns: a frame first named by the exit
    flush was named after the file instead (``job.*``), so one script had two names, by how
    long it ran.  ``sys.argv[0]`` names the script (or ``-m``'s file) to the end.  The name
    stays ``__main__``: it is Python's own (``__name__``), every stored profile already has
    it, and the service name tells which program it is."""
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if not isinstance(main, str):
        main = sys.argv[0] if sys.argv else ""
    if not main or main.startswith("-"):  # -c, or not set yet
        return False
    if main == filename:
        return True
    if os.path.basename(main) != os.path.basename(filename):
        return False
    try:
        return os.path.samefile(main, filename)
    except (OSError, ValueError):
        return False


def _line_of(named: _Named, lasti: int) -> int:
    """The line of the instruction at byte offset ``lasti``, from a table built once per code
    object (3.10+: ``co_lines``; 3.9: ``co_lnotab``, through ``dis``)."""
    if named.line_table is None:
        named.line_table = _line_table(named.code)
    starts, lines = named.line_table
    i = bisect_right(starts, lasti) - 1
    return lines[i] if i >= 0 else named.first_line


def _line_table(code: Any) -> Tuple[List[int], List[int]]:
    starts: List[int] = []
    lines: List[int] = []
    if hasattr(code, "co_lines"):
        for start, _end, line in code.co_lines():
            starts.append(start)
            lines.append(line if line is not None else code.co_firstlineno)
    else:
        import dis  # 3.9 only

        for offset, line in dis.findlinestarts(code):
            starts.append(offset)
            lines.append(line)
    return starts, lines
