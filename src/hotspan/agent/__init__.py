"""The in-process agent: ``hotspan.configure(...)`` samples every thread and pushes pprof.

The public API lives here and in :mod:`hotspan` (which re-exports it); the parts are
:mod:`.sampler` (taking samples), :mod:`.context` (span and tag labels that follow
``contextvars``), :mod:`.pprof_writer` (encoding), :mod:`.uploader` (getting them to the
server) and :mod:`.core` (the loop tying them together).
"""

from __future__ import annotations

import os
import threading

from hotspan.agent import context
from hotspan.agent.config import AgentConfig, ConfigError, from_env
from hotspan.agent.context import tag_wrapper
from hotspan.agent.current import current_agent, set_current
from hotspan.agent.gc_footprint import untrack_own_code
from hotspan.agent.main_code import keep_main_module_code

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any

__all__ = ["AgentConfig", "ConfigError", "configure", "shutdown", "tag_wrapper", "current_agent"]

_lock = threading.Lock()


def configure(**settings: Any) -> Any:
    """Start profiling this process (again, with new settings, if it already was).

    Settings are :class:`AgentConfig` fields; those not given come from ``HOTSPAN_*`` or
    ``PYROSCOPE_*`` environment variables.  Raises :class:`ConfigError` for bad settings (the
    only time the agent raises into the program); once running it never does.
    """
    from hotspan.agent.core import Agent

    config = from_env(**settings).validate()
    _register_fork_handler()
    with _lock:
        previous = current_agent()
        if previous is not None:
            previous.shutdown(flush=True)
        agent = Agent(config)
        set_current(agent)
        if config.native:
            # Before sampling starts: the walk is the agent's time, not the program's.  What
            # start() imports is untracked at the loop's first wake.
            untrack_own_code()
        agent.start()
        keep_main_module_code()
        return agent


def shutdown(flush: bool = True) -> None:
    """Stop profiling; with ``flush``, send what was collected (within the exit deadline)."""
    with _lock:
        agent = set_current(None)
    if agent is not None:
        agent.shutdown(flush=flush)


_fork_handler_registered = False


def _register_fork_handler() -> None:
    # register_at_fork cannot be undone, so one handler serves whichever agent is current.
    global _fork_handler_registered
    if not _fork_handler_registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _fork_handler_registered = True


def _after_fork_in_child() -> None:
    global _lock
    context.reset_after_fork()
    # The lock a parent thread may have held is not ours to wait for.
    _lock = threading.Lock()
    agent = current_agent()
    if agent is not None:
        agent.after_fork_in_child()
