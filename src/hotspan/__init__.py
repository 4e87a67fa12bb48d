"""hotspan: continuous profiling for Python services, linked to their traces.

``import hotspan; hotspan.configure(application_name="api")`` starts the agent; the server,
store and query engine are separate packages that the agent never imports.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "configure", "current_agent", "shutdown", "tag_wrapper"]


def configure(**settings: Any) -> Any:
    from hotspan.agent import configure as _configure

    return _configure(**settings)


def shutdown(flush: bool = True) -> None:
    from hotspan.agent import shutdown as _shutdown

    _shutdown(flush=flush)


def current_agent() -> Any:
    """The running agent (``sampler_stats``, ``collector_stats()``, ...), or None."""
    from hotspan.agent import current_agent as _current_agent

    return _current_agent()


def tag_wrapper(tags: dict) -> Any:
    from hotspan.agent import tag_wrapper as _tag_wrapper

    return _tag_wrapper(tags)
