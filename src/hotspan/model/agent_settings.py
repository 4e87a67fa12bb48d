"""Profiling settings an operator can change while agents run, and the agent's report of them.

The same checks serve the three places settings come from: a ``PUT`` to an agent's control
endpoint, a ``PUT`` to the server's ``/api/v1/settings/{service}`` (which agents then follow),
and ``hotspan settings set``.  A setting left out is not changed; a setting the checks do not
know is an error, so a typo never silently does nothing.

This module is imported by the agent: standard library only, nothing imported at run time.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Dict

# What an agent can take: the sampler's two profiles and the collectors'.
PROFILE_TYPES = ("cpu", "wall", "alloc", "locks", "threads")

# Setting -> (kind, low, high).  Bounds are inclusive; None is unbounded.
SETTINGS: Dict[str, tuple] = {
    "enabled": (bool, None, None),
    "sample_rate": (int, 1, 1000),
    "profile_types": (list, None, None),
    "alloc_sample_bytes": (int, 0, 1 << 30),
    "conditional_only": (bool, None, None),
    "slow_request_threshold": (float, 0.0, 86400.0),
    "max_overhead": (float, 0.01, 100.0),
}

# Headers an agent sends with every upload and poll; without them a request is an ordinary
# Pyroscope upload and its answer stays empty.
INSTANCE_HEADER = "X-Hotspan-Instance"
STATUS_HEADER = "X-Hotspan-Agent-Status"
MAX_INSTANCE_CHARS = 200
MAX_STATUS_BYTES = 4096


class SettingsError(ValueError):
    """Settings that cannot be applied; the message names the setting and the problem."""


def validate_settings(settings: Any) -> Dict[str, Any]:
    """``settings`` (decoded JSON) checked and normalised: a new dict, or SettingsError."""
    if not isinstance(settings, dict):
        raise SettingsError(f"settings must be a JSON object, not {type(settings).__name__}")
    out: Dict[str, Any] = {}
    for name, value in settings.items():
        spec = SETTINGS.get(name)
        if spec is None:
            known = ", ".join(SETTINGS)
            raise SettingsError(f"unknown setting {name!r} (known: {known})")
        out[name] = _check(name, value, *spec)
    return out


def _check(name: str, value: Any, kind: type, low: Any, high: Any) -> Any:
    if kind is bool:
        if not isinstance(value, bool):
            raise SettingsError(f"{name} must be true or false, not {value!r}")
        return value
    if kind is list:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise SettingsError(f"{name} must be a list of names from {list(PROFILE_TYPES)}")
        unknown = [v for v in value if v not in PROFILE_TYPES]
        if unknown:
            raise SettingsError(
                f"{name}: unknown profile type(s) {unknown} (known: {list(PROFILE_TYPES)})"
            )
        return sorted(set(value), key=PROFILE_TYPES.index)
    # JSON has one number type: an int setting takes 50 or 50.0, never 50.5 or true.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SettingsError(f"{name} must be a number, not {value!r}")
    if value != value or value in (float("inf"), float("-inf")):
        raise SettingsError(f"{name} must be a finite number, not {value!r}")
    if kind is int:
        if value != int(value):
            raise SettingsError(f"{name} must be a whole number, not {value!r}")
        value = int(value)
    else:
        value = float(value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise SettingsError(f"{name} {value!r} must be between {low} and {high}")
    return value
