"""The agent's logger, loaded on first use.

What the agent imports stays in the program for good, and every full collection of its cyclic
garbage collector walks the functions, classes and dicts those modules brought: a program that
makes many containers ran +11 to +17% slower for an agent that imported ``logging``,
``typing``, ``dataclasses`` and friends on ``configure``.  The agent logs only when something
goes wrong, so ``logging`` (with ``re``, ``traceback``, ``string``, ``weakref``: ~3,500 objects)
waits until then.  For the same reason the agent's modules import ``typing`` only for type
checkers (``TYPE_CHECKING``), and use ``collections.namedtuple`` at run time.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import logging

NAME = "hotspan.agent"


class LazyLogger:
    """``logging.getLogger(NAME)``, resolved when first used."""

    __slots__ = ("_logger",)

    def __init__(self) -> None:
        self._logger: logging.Logger | None = None

    def __getattr__(self, attribute: str) -> object:
        logger = self._logger
        if logger is None:
            import logging

            logger = self._logger = logging.getLogger(NAME)
        return getattr(logger, attribute)


if TYPE_CHECKING:
    logger: logging.Logger  # what LazyLogger hands on
else:
    logger = LazyLogger()
