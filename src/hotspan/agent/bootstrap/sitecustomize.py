"""Imported by Python at start-up in a program run by ``hotspan run``, whose PYTHONPATH starts
with this directory: starts the agent, then imports the ``sitecustomize`` this one hides.

Nothing here may stop the program: a failure is one ``hotspan:`` line on stderr, and the
program runs unprofiled.  Only the program ``hotspan run`` started says so: the processes it
starts inherit PYTHONPATH, and one run by a Python without hotspan must not find a line in
the stderr its parent may read.
"""

import os
import sys


def _start_agent() -> None:
    try:
        from hotspan.agent.run import bootstrap

        bootstrap()
    except Exception as exc:
        try:
            if os.environ.get("HOTSPAN_RUN_PARENT", str(os.getppid())) != str(os.getppid()):
                return
            sys.stderr.write(f"hotspan: not profiling: {exc or type(exc).__name__}\n")
            sys.stderr.flush()
        except Exception:
            pass


def _chain() -> None:
    """Import the next ``sitecustomize`` on sys.path, as Python would have without us.

    Its errors propagate, so site.py reports them exactly as it would have.
    """
    here = os.path.normcase(os.path.dirname(os.path.abspath(__file__)))
    removed = [
        (i, p) for i, p in enumerate(sys.path) if os.path.normcase(os.path.abspath(p)) == here
    ]
    if not removed:
        return
    for i, _ in reversed(removed):
        del sys.path[i]
    ours = sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401 - the one ours hides, run for its side effects
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
        if ours is not None:
            sys.modules["sitecustomize"] = ours
    finally:
        # Put this directory back where it was, so sys.path reads as PYTHONPATH says.
        for i, p in removed:
            sys.path.insert(i, p)


_start_agent()
_chain()
