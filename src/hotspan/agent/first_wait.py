"""Starting one of the agent's threads: the starter goes on once the thread has first waited.

Until its first wait the thread runs Python, and one still wanting the GIL as the program gets
busy waits for it in the GIL's queue, woken at every drop of it (see
``_speedups/sampler/turns.c``): the program waits for the thread here instead, for
``START_WAIT_S`` at most.  The signal is a lock of ``_thread``'s own: the lock profile does not
wrap it (the wait is the agent's, not the program's), and there is no Event's condition, lock
and waiter list for the program's GC to walk.
"""

from __future__ import annotations

import _thread

START_WAIT_S = 1.0


class FirstWait:
    """Made for one start of one thread: the thread calls :meth:`reached` as it waits (again
    and again if that is easier: only the first counts), the starter :meth:`wait`."""

    __slots__ = ("_lock", "_reached")

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()
        self._reached = False

    def reached(self) -> None:
        if not self._reached:
            self._reached = True
            self._lock.release()

    def wait(self) -> None:
        self._lock.acquire(timeout=START_WAIT_S)
