"""The code of the program's main module, kept alive until the agent's last profile.

CPython frees the main script's ``<module>`` code as soon as its last line has run, before
any exit handler.  Samples keep raw code pointers until the agent pins them (its loop thread
does, every tick), so the samples of the last moments, or of a whole program shorter than one
tick, would have lost the root of the main thread's every stack by the final upload: they would
read ``<unknown>``.  One reference, taken as the module starts, is all it takes.
"""

from __future__ import annotations

import sys
import threading

from hotspan.agent.symbols import agent_code

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from types import CodeType, FrameType
    from typing import Any, Dict, List, Optional

# Profile events the watcher waits through for the main module before it gives up (a host
# that embeds Python may never run one): a few milliseconds of start-up at most.
WATCH_LIMIT = 100_000

_kept: List[CodeType] = []


def keep_main_module_code() -> None:
    """Keeps the main module's ``<module>`` code alive: at once if it is running, else (called
    on the main thread before it runs, as from ``sitecustomize``) as soon as it starts."""
    main = sys.modules.get("__main__")
    if main is None or _kept:
        return
    ident = threading.main_thread().ident
    frame = sys._current_frames().get(ident) if ident is not None else None
    running = _outermost_main(frame, main.__dict__)
    if running is not None:
        _kept.append(running)
    elif threading.current_thread() is threading.main_thread() and sys.getprofile() is None:
        _watch(main.__dict__)


def _outermost_main(frame: Optional[FrameType], main: Dict[str, Any]) -> Optional[CodeType]:
    found = None
    while frame is not None:
        if frame.f_globals is main and frame.f_code.co_name == "<module>":
            found = frame.f_code
        frame = frame.f_back
    return found


def _watch(main: Dict[str, Any]) -> None:
    """A profile function on this thread until the first frame of the main module (a script,
    ``-c``, ``-m`` through runpy): then it keeps that module's code and goes."""
    events = [0]

    def watch(frame: FrameType, event: str, arg: object) -> None:
        if frame.f_globals is main:
            code = _outermost_main(frame, main)
            if code is not None:
                _kept.append(code)
            sys.setprofile(None)
            return
        events[0] += 1
        if events[0] > WATCH_LIMIT:
            sys.setprofile(None)

    agent_code(watch.__code__)  # sampled inside it, the program's stack is hotspan's work
    sys.setprofile(watch)
