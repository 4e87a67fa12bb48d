"""hotspan: continuous profiling for Python services, linked to their traces.

``import hotspan; hotspan.configure(application_name="api")`` starts the agent; the server,
store and query engine are separate packages that the agent never imports.
"""

import sys

# The modules loaded before the agent: those of the standard library that are not, the agent
# brought, and their code is kept out of the cyclic GC's walks with its own
# (agent/gc_footprint.py).  Taken again as configure() first imports the agent, so that what
# the program imported meanwhile stays its own.  A tuple of strings: the GC does not track
# it.  Hence also no ``from __future__ import annotations`` here, which would load
# ``__future__`` first.
_MODULES_BEFORE = tuple(sys.modules)

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "configure", "current_agent", "shutdown", "tag_wrapper"]


def configure(**settings: "Any") -> "Any":
    global _MODULES_BEFORE
    if "hotspan.agent" not in sys.modules:
        _MODULES_BEFORE = tuple(sys.modules)
    from hotspan.agent import configure as _configure

    return _configure(**settings)


def shutdown(flush: bool = True) -> None:
    from hotspan.agent import shutdown as _shutdown

    _shutdown(flush=flush)


def current_agent() -> "Any":
    """The running agent (``sampler_stats``, ``collector_stats()``, ...), or None."""
    from hotspan.agent import current_agent as _current_agent

    return _current_agent()


def tag_wrapper(tags: dict) -> "Any":
    from hotspan.agent import tag_wrapper as _tag_wrapper

    return _tag_wrapper(tags)
