"""The settings in force while the agent runs, from three sources.

- the agent's configuration (``hotspan.configure`` / ``HOTSPAN_*``): the base;
- the server's settings for this service, read in each upload's answer (``version`` > 0 while
  a rule applies; ``None`` settings send the agent back to its base);
- the process's own control endpoint (``POST``/``DELETE``/``PUT``): local overrides, which
  win, as the person at one instance is the one who asked last for that instance.

Anyone may change them from any thread; the agent's loop applies the result (see
``Agent._apply_settings``), so the sampler and collectors are only ever restarted there.
"""

from __future__ import annotations

import threading

from hotspan.model.agent_settings import PROFILE_TYPES

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

    from hotspan.agent.config import AgentConfig

# Where alloc is switched on live and the configuration had it at 0 (off).
DEFAULT_ALLOC_SAMPLE_BYTES = 512 * 1024


def base_settings(config: AgentConfig) -> Dict[str, Any]:
    types: List[str] = []
    for name, on in (
        ("cpu", config.cpu),
        ("wall", config.wall),
        ("alloc", config.alloc_sample_bytes > 0),
        ("locks", config.locks),
        ("threads", config.threads),
    ):
        if on:
            types.append(name)
    return {
        "enabled": bool(config.enabled),
        "sample_rate": int(config.sample_rate),
        "profile_types": types,
        "alloc_sample_bytes": int(config.alloc_sample_bytes or DEFAULT_ALLOC_SAMPLE_BYTES),
        "conditional_only": bool(config.conditional_only),
        "slow_request_threshold": float(getattr(config, "slow_request_threshold", 0.0)),
        "max_overhead": float(config.max_overhead),
    }


class LiveSettings:
    def __init__(self, config: AgentConfig) -> None:
        self._lock = threading.Lock()
        self._base = base_settings(config)
        self._remote: Dict[str, Any] = {}
        self._local: Dict[str, Any] = {}
        self.remote_version = 0
        # Bumped by every change; the loop compares it with the one it applied last.
        self.generation = 0
        # Called after each change (the agent's loop sleeps until one, or its interval).
        self.on_change: Optional[Callable[[], None]] = None

    def effective(self) -> Dict[str, Any]:
        return self.snapshot()[0]

    def snapshot(self) -> Tuple[Dict[str, Any], int, int]:
        """(settings in force, the server's version they include, generation), together."""
        with self._lock:
            out = dict(self._base)
            out.update(self._remote)
            out.update(self._local)
            return out, self.remote_version, self.generation

    @property
    def local(self) -> Dict[str, Any]:
        with self._lock:
            return dict(self._local)

    @property
    def remote(self) -> Dict[str, Any]:
        with self._lock:
            return dict(self._remote)

    def reset_after_fork(self) -> None:
        self._lock = threading.Lock()  # a parent thread may have held it at the fork

    def set_enabled(self, enabled: bool) -> None:
        """``POST`` / ``DELETE`` on the control endpoint."""
        with self._lock:
            self._local["enabled"] = enabled
            self._bump()

    def replace_local(self, settings: Mapping[str, Any]) -> None:
        """``PUT`` on the control endpoint: these overrides replace the previous ones, except
        ``enabled``, which stays as the last POST/DELETE left it unless the object names it.
        An empty object clears them all, ``enabled`` too: the instance follows the server's
        settings and its own configuration again."""
        with self._lock:
            enabled = self._local.get("enabled")
            self._local = dict(settings)
            if settings and "enabled" not in settings and enabled is not None:
                self._local["enabled"] = enabled
            self._bump()

    def set_remote(self, version: int, settings: Optional[Mapping[str, Any]]) -> bool:
        """The server's answer; True if it changed anything."""
        with self._lock:
            new = dict(settings or {})
            if version == self.remote_version and new == self._remote:
                return False
            self.remote_version, self._remote = version, new
            self._bump()
            return True

    def _bump(self) -> None:
        self.generation += 1
        if self.on_change is not None:
            self.on_change()


def profile_types(settings: Mapping[str, Any]) -> List[str]:
    return [t for t in PROFILE_TYPES if t in settings.get("profile_types", ())]
