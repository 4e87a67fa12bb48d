"""The agent's own code kept out of the cyclic GC's walks.

Every full collection walks every object the GC tracks.  The agent's modules, with their
dicts, functions and classes, live as long as the process, so no collection can ever free them,
yet each one walks them: in a program whose own heap is small and whose GC is busy, that was
a few percent of its time (``bench/agent_workloads/gc_containers.py``).  Untracked
(``_sampler.gc_untrack``), they are not walked.  Only code is untracked, never the agent's
state (its instances, queues, lists): a dict among the untracked that is given a container
later tracks itself again, as CPython does on insertion.  Without the native sampler nothing
is untracked (Python cannot).
"""

from __future__ import annotations

import gc
import sys
import types

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Callable, List, Set

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


def own_code() -> List[Any]:
    """hotspan's loaded modules, their dicts, specs and loaders, and the functions and
    classes (their dicts, MROs and descriptors) defined in them."""
    found: List[Any] = []
    seen: Set[int] = set()

    def add(obj: Any) -> None:
        if id(obj) not in seen:
            seen.add(id(obj))
            found.append(obj)

    for name, module in list(sys.modules.items()):
        if module is None or not _is_own(name):
            continue
        add(module)
        namespace = vars(module)
        add(namespace)
        for attribute in ("__spec__", "__loader__"):
            extra = namespace.get(attribute)
            if extra is not None and getattr(extra, "__module__", "") != "builtins":
                add(extra)
                own = getattr(extra, "__dict__", None)
                if isinstance(own, dict):
                    add(own)
        for value in list(namespace.values()):
            _add_code(value, add, seen)
    return found


def untrack_own_code() -> int:
    """Untracks :func:`own_code` (with the native sampler; else nothing): how many were
    tracked."""
    global _modules_seen, _own_seen
    from hotspan._speedups import load_sampler

    native = load_sampler()
    if native is None:
        return 0
    _modules_seen = len(sys.modules)
    _own_seen = _own_modules()
    return native.gc_untrack(own_code())


def untrack_new_code() -> None:
    """:func:`untrack_own_code` again if hotspan modules were imported since (the agent
    imports its encoder and transport at its first upload).  Cheap when nothing was: the
    loop's thread calls it at each wake."""
    global _modules_seen
    if len(sys.modules) == _modules_seen:
        return
    _modules_seen = len(sys.modules)
    if _own_modules() != _own_seen:
        untrack_own_code()


_modules_seen = 0
_own_seen = 0


def _own_modules() -> int:
    return sum(1 for name in list(sys.modules) if _is_own(name))


def _is_own(module_name: str) -> bool:
    return module_name == _OWN or module_name.startswith(_OWN + ".")


def _add_code(value: Any, add: Callable[[Any], None], seen: Set[int]) -> None:
    if isinstance(value, types.FunctionType):
        if _is_own(getattr(value, "__module__", None) or ""):
            _add_function(value, add)
    elif isinstance(value, types.BuiltinFunctionType):
        owner = getattr(value, "__self__", None)
        if isinstance(owner, types.ModuleType) and _is_own(owner.__name__):
            add(value)
    elif (
        isinstance(value, type)
        and _is_own(getattr(value, "__module__", None) or "")
        and id(value) not in seen
    ):
        _add_class(value, add, seen)


def _add_function(function: types.FunctionType, add: Callable[[Any], None]) -> None:
    add(function)
    # Its defaults, closure tuple, annotations and own dict, as far as they exist (reading
    # __dict__ would make one); not its module's globals nor the builtins, which are shared.
    shared = (function.__globals__, getattr(function, "__builtins__", None))
    for part in gc.get_referents(function):
        if type(part) in (tuple, dict) and not any(part is s for s in shared):
            add(part)


def _add_class(cls: type, add: Callable[[Any], None], seen: Set[int]) -> None:
    add(cls)
    add(cls.__mro__)
    add(cls.__bases__)
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
        else:
            _add_code(value, add, seen)
