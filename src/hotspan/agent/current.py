"""The agent running in this process, if any: what the control port, the pull endpoints and
the fork handler ask for.  A module of its own, importing nothing, so that the parts the agent
starts can find it without importing the package that starts them."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Optional

_agent: Optional[Any] = None


def current_agent() -> Optional[Any]:
    return _agent


def set_current(agent: Optional[Any]) -> Optional[Any]:
    """Makes ``agent`` the running one; returns the one it replaces."""
    global _agent
    previous, _agent = _agent, agent
    return previous
