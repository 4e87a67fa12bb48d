"""Running code as a module is imported, without importing it: the agent hooks OpenTelemetry's
context and asyncio's locks this way, so that a program that never uses them does not load
them for the agent (and keeps nothing of them for its GC to walk)."""

from __future__ import annotations

import sys

from hotspan.agent.log import logger

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Callable


class AfterImport:
    """A meta path finder that lets module ``name`` load as it would, then calls
    ``then(module)``; an error there is logged, never raised into the program's import.

    It finds the module once: then it leaves ``sys.meta_path`` and stands in as the module's
    loader, handing everything but the hook on to the real one (one object for both roles:
    what the agent leaves in the program, its GC walks)."""

    _loader: Any = None  # the real loader, once the module was found

    def __init__(self, name: str, then: Callable[[Any], object]) -> None:
        self.name = name
        self.then = then

    def install(self) -> None:
        sys.meta_path.insert(0, self)

    def uninstall(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.name or self._loader is not None:
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        self._loader = spec.loader
        spec.loader = self  # type: ignore[assignment]  # a Loader by duck typing
        self.uninstall()
        return spec

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        try:
            self.then(module)
        except Exception:  # noqa: BLE001 - never break the program's import
            logger.debug("hotspan: %s not hooked", self.name, exc_info=True)

    def __getattr__(self, attribute: str) -> Any:
        loader = self._loader  # a class attribute until found: no recursion here
        if loader is None:
            raise AttributeError(attribute)
        return getattr(loader, attribute)
