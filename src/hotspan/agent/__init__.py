"""The in-process agent: ``hotspan.configure(...)`` samples every thread and pushes pprof.

The public API lives here and in :mod:`hotspan` (which re-exports it); the parts are
:mod:`.sampler` (taking samples), :mod:`.context` (span and tag labels that follow
``contextvars``), :mod:`.pprof_writer` (encoding), :mod:`.uploader` (getting them to the
server) and :mod:`.core` (the loop tying them together).
"""

from __future__ import annotations

import threading

from hotspan.agent.config import AgentConfig, ConfigError, from_env
from hotspan.agent.context import tag_wrapper

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Optional

__all__ = ["AgentConfig", "ConfigError", "configure", "shutdown", "tag_wrapper", "current_agent"]

_lock = threading.Lock()
_agent: Optional[Any] = None


def configure(**settings: Any) -> Any:
    """Start profiling this process (again, with new settings, if it already was).

    Settings are :class:`AgentConfig` fields; those not given come from ``HOTSPAN_*`` or
    ``PYROSCOPE_*`` environment variables.  Raises :class:`ConfigError` for bad settings (the
    only time the agent raises into the program); once running it never does.
    """
    from hotspan.agent.core import Agent

    global _agent
    config = from_env(**settings).validate()
    with _lock:
        if _agent is not None:
            _agent.shutdown(flush=True)
        _agent = Agent(config)
        _agent.start()
        return _agent


def shutdown(flush: bool = True) -> None:
    """Stop profiling; with ``flush``, send what was collected (within the exit deadline)."""
    global _agent
    with _lock:
        agent, _agent = _agent, None
    if agent is not None:
        agent.shutdown(flush=flush)


def current_agent() -> Optional[Any]:
    return _agent


def reset_after_fork() -> None:
    """In a forked child: the lock a parent thread may have held is not ours to wait for."""
    global _lock
    _lock = threading.Lock()
