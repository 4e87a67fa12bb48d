"""What ``hotspan attach`` and ``hotspan detach`` run inside a running Python.

CPython 3.14 runs a script file in a live interpreter at its next safe point when asked with
``sys.remote_exec`` (PEP 768).  :func:`remote_script` writes that script: it imports this
module (the target's own hotspan, else the one at the path given) and calls :func:`start` or
:func:`stop`, which report in a JSON file the command waits for.  Nothing here raises into
the program, and a start that fails leaves no agent behind.
"""

from __future__ import annotations

import json
import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Dict, Mapping

# The agent an attach started: detach stops that one only, never the program's own.
_started: Any = None


def start(settings_path: str, status_path: str) -> None:
    """Start the agent with the settings in ``settings_path`` (``HOTSPAN_*`` names and values,
    over the program's own environment)."""
    global _started
    try:
        from hotspan import __version__
        from hotspan.agent import configure, current_agent, shutdown
        from hotspan.agent.config import SETTINGS, from_env

        with open(settings_path, encoding="utf-8") as f:
            wanted: Dict[str, str] = json.load(f)
        if current_agent() is not None:
            _report(status_path, {"ok": False, "error": "hotspan already profiles this process"})
            return
        config = from_env({**os.environ, **wanted}).validate()
        try:
            agent = configure(**{name: getattr(config, name) for name in SETTINGS})
        except BaseException:
            shutdown(flush=False)  # never a half-started agent
            raise
        _started = agent
        _report(
            status_path,
            {
                "ok": True,
                "pid": os.getpid(),
                "sampler": agent.sampler_name,
                "version": __version__,
                "application_name": config.application_name,
            },
        )
    except BaseException as exc:  # noqa: BLE001 - reported to the command, not the program
        _report(status_path, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})


def stop(status_path: str) -> None:
    """Stop the agent, sending what it collected; the program goes on as before it started."""
    global _started
    try:
        from hotspan.agent import current_agent, shutdown

        agent = current_agent()
        if agent is None:
            _report(status_path, {"ok": False, "error": "hotspan does not profile this process"})
            return
        if agent is not _started:
            _report(
                status_path,
                {
                    "ok": False,
                    "error": "the program started its agent itself (hotspan.configure or "
                    "hotspan run), not hotspan attach: it is left running",
                },
            )
            return
        shutdown(flush=True)
        _started = None
        _report(status_path, {"ok": True, "pid": os.getpid()})
    except BaseException as exc:  # noqa: BLE001 - reported to the command, not the program
        _report(status_path, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})


def _report(path: str, answer: Mapping[str, Any]) -> None:
    # Written whole, then renamed: the command never reads half a file.
    partial = path + ".partial"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(answer, f)
    os.replace(partial, path)


def remote_script(action: str, package_root: str, *paths: str) -> str:
    """The script ``sys.remote_exec`` runs: ``action`` (start or stop) of this module, from the
    target's own hotspan when it has one, else from ``package_root`` (the directory holding
    the ``hotspan`` package), which leaves the target's ``sys.path`` as it was."""
    args = ", ".join(repr(p) for p in paths)
    status = paths[-1]
    return f"""\
def _hotspan_attach():
    import sys
    try:
        try:
            from hotspan.agent import attach
        except ImportError:
            sys.path.insert(0, {package_root!r})
            try:
                from hotspan.agent import attach
            finally:
                if {package_root!r} in sys.path:
                    sys.path.remove({package_root!r})
    except BaseException as exc:
        import json
        with open({status!r}, "w", encoding="utf-8") as f:
            json.dump({{"ok": False, "error": "hotspan cannot be imported there: %s: %s"
                       % (type(exc).__name__, exc)}}, f)
        return
    attach.{action}({args})


try:
    _hotspan_attach()
finally:
    del _hotspan_attach
"""
