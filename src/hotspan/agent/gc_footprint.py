"""The agent's own code kept out of the cyclic GC's walks.

Every full collection walks every object the GC tracks.  The agent's modules, with their
dicts, functions and classes, live as long as the process, so no collection can ever free them,
yet each one walks them: in a program whose own heap is small and whose GC is busy, that was
a few percent of its time (``bench/agent_workloads/gc_containers.py``).  Untracked
(``_sampler.gc_untrack``), they are not walked.  Only code is untracked, never the agent's
state (its instances, queues, lists): a dict among the untracked that is given a container
later tracks itself again, as CPython does on insertion.  Without the native sampler nothing
is untracked (Python cannot).

Code is what lives as long as its module: the module, its dict, spec and loader (and their
lists), its functions and classes (their dicts, MROs, descriptors, and the weak references
CPython keeps to each class from its bases), the module's tuples and frozensets, and the
import system's finders for hotspan's package directories.  "Its modules" are hotspan's and,
at ``configure()``, the standard library's modules that were not loaded before ``import
hotspan`` (the agent brought them: ``__future__``, ``contextvars``...); a program's own
modules are never touched.  Later, as the agent imports more of itself (its encoder at the
first upload), only those new modules are walked: the walk holds the GIL on the agent's
thread, and everything again (with what the program imported since) takes it for 15-25 ms on a
loaded machine, a stall of the program's threads.
"""

from __future__ import annotations

import gc
import sys
import types
from _weakref import getweakrefs, ref

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Callable, FrozenSet, List, Set, Tuple

# Objects that hold code or describe it: what is untracked.  Instances of anything else are
# state and stay tracked.
_DESCRIPTORS = (staticmethod, classmethod, property)
_C_DESCRIPTORS = (
    types.GetSetDescriptorType,
    types.MemberDescriptorType,
    types.MethodDescriptorType,
    types.ClassMethodDescriptorType,
    types.WrapperDescriptorType,
)
_OWN = "hotspan"
# Immutable values of a module (or members of its finder's tables): replaced, never changed.
_CONSTANTS = (tuple, frozenset)


def own_code(names: FrozenSet[str]) -> List[Any]:
    """The code of `names`, modules the agent owns (see the module's docstring): modules,
    their dicts, specs, loaders and finders, and the functions and classes defined in them."""
    found: List[Any] = []
    seen: Set[int] = set()

    def add(obj: Any) -> None:
        if id(obj) not in seen:
            seen.add(id(obj))
            found.append(obj)

    owned = names | frozenset(_walked)
    for name in sorted(names):
        module = sys.modules.get(name)
        if module is None:
            continue
        add(module)
        namespace = vars(module)
        add(namespace)
        for attribute in ("__spec__", "__loader__"):
            extra = namespace.get(attribute)
            if extra is not None and getattr(extra, "__module__", "") != "builtins":
                add(extra)
                _add_instance_dict(extra, add)
        for attribute in ("__path__", "__all__"):
            if isinstance(namespace.get(attribute), list):
                add(namespace[attribute])
        if _is_own(name):
            for directory in namespace.get("__path__") or ():
                finder = sys.path_importer_cache.get(directory)
                if finder is not None:
                    add(finder)
                    _add_instance_dict(finder, add)
        for value in list(namespace.values()):
            if isinstance(value, _CONSTANTS):
                _add_constant(value, add)
            else:
                _add_code(value, add, seen, owned)
    return found


def untrack_own_code() -> int:
    """Untracks :func:`own_code` (with the native sampler; else nothing): how many were
    tracked."""
    return _untrack(_owned_modules())


def untrack_new_code() -> None:
    """Untracks the code of hotspan's modules imported since the last walk (the agent
    imports its encoder and transport at its first upload), and of nothing else.  Cheap
    when none was: the loop's thread calls it at each wake."""
    global _modules_seen
    if len(sys.modules) == _modules_seen:
        return
    _modules_seen = len(sys.modules)
    walked = frozenset(_walked)
    new = frozenset(name for name in list(sys.modules) if _is_own(name) and name not in walked)
    if new:
        _untrack(new)


def _untrack(names: FrozenSet[str]) -> int:
    global _modules_seen, _walked
    from hotspan._speedups import load_sampler

    native = load_sampler()
    if native is None:
        return 0
    _modules_seen = len(sys.modules)
    code = own_code(names)
    # A tuple of strings, which CPython's GC stops tracking itself.
    _walked = tuple(frozenset(_walked) | names)
    return native.gc_untrack(code)


_modules_seen = 0
_walked: Tuple[str, ...] = ()


def _owned_modules() -> FrozenSet[str]:
    """hotspan's modules, and the standard library's that were not loaded before it."""
    # Read from the package's module, not imported: the agent stands on model and
    # _speedups alone (tests/test_layers.py).
    before = set(getattr(sys.modules.get(_OWN), "_MODULES_BEFORE", ()))
    stdlib: FrozenSet[str] = getattr(sys, "stdlib_module_names", frozenset())  # 3.10+
    return frozenset(
        name
        for name in list(sys.modules)
        if _is_own(name) or (before and name not in before and name.partition(".")[0] in stdlib)
    )


def _is_own(module_name: str) -> bool:
    return module_name == _OWN or module_name.startswith(_OWN + ".")


def _add_code(
    value: Any, add: Callable[[Any], None], seen: Set[int], owned: FrozenSet[str]
) -> None:
    if isinstance(value, types.FunctionType):
        if getattr(value, "__module__", None) in owned:
            _add_function(value, add)
    elif isinstance(value, types.BuiltinFunctionType):
        owner = getattr(value, "__self__", None)
        if isinstance(owner, types.ModuleType) and owner.__name__ in owned:
            add(value)
    elif (
        isinstance(value, type)
        and getattr(value, "__module__", None) in owned
        and id(value) not in seen
    ):
        _add_class(value, add, seen, owned)


def _add_constant(value: Any, add: Callable[[Any], None], depth: int = 2) -> None:
    """A tuple or frozenset, or a list or set of a loader's tables, and the like inside it."""
    if not gc.is_tracked(value):
        return  # CPython untracks tuples of atoms itself
    add(value)
    if depth:
        for item in value:
            if isinstance(item, (tuple, frozenset, list, set)):
                _add_constant(item, add, depth - 1)


def _add_instance_dict(obj: Any, add: Callable[[Any], None]) -> None:
    """An import system object's dict and the lists and sets in it (a spec's submodule
    locations, a finder's loaders and directory listing: replaced when they change)."""
    namespace = getattr(obj, "__dict__", None)
    if isinstance(namespace, dict):
        add(namespace)
        for value in list(namespace.values()):
            if isinstance(value, (list, set) + _CONSTANTS):
                _add_constant(value, add)


def _add_function(function: types.FunctionType, add: Callable[[Any], None]) -> None:
    add(function)
    # Its defaults, closure tuple, annotations and own dict, as far as they exist (reading
    # __dict__ would make one); not its module's globals nor the builtins, which are shared.
    shared = (function.__globals__, getattr(function, "__builtins__", None))
    for part in gc.get_referents(function):
        if type(part) in (tuple, dict) and not any(part is s for s in shared):
            add(part)


def _add_class(
    cls: type, add: Callable[[Any], None], seen: Set[int], owned: FrozenSet[str]
) -> None:
    add(cls)
    add(cls.__mro__)
    add(cls.__bases__)
    # Each base's registry of subclasses holds a weak reference to the class (no callback:
    # it lives as long as the class, which is forever).
    for reference in getweakrefs(cls):
        if getattr(reference, "__callback__", None) is None and type(reference) is ref:
            add(reference)
    # The class's own dict, behind its mappingproxy.
    for namespace in gc.get_referents(cls.__dict__):
        if isinstance(namespace, dict):
            add(namespace)
    for value in list(vars(cls).values()):
        if isinstance(value, _DESCRIPTORS):
            add(value)
            for part in (
                getattr(value, "__func__", None),
                getattr(value, "fget", None),
                getattr(value, "fset", None),
                getattr(value, "fdel", None),
            ):
                if isinstance(part, types.FunctionType):
                    _add_function(part, add)
        elif isinstance(value, _C_DESCRIPTORS):
            add(value)
        elif isinstance(value, types.BuiltinFunctionType) and value.__self__ is cls:
            add(value)  # __new__ of a class with a C base
        else:
            _add_code(value, add, seen, owned)
