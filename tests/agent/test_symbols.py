"""Naming sampled stacks: the C frame cache gives what the Python Symbolizer gives, keeps
names right when a code object dies and another takes its address, and stays bounded."""

from __future__ import annotations

import gc
import sys
import weakref
from typing import Any, List, Tuple

import pytest

from hotspan.agent import symbols
from hotspan.agent.symbols import UNKNOWN, Symbolizer

needs_c = pytest.mark.skipif(symbols._native is None, reason="the C frame cache is not built")


def _stack_here() -> List[Tuple[Any, int]]:
    out = []
    frame = sys._getframe()
    while frame is not None:
        out.append((frame.f_code, frame.f_lasti))
        frame = frame.f_back
    return out


def _python_names(stack: List[Tuple[Any, int]]) -> Tuple[Any, ...]:
    python = Symbolizer()
    return tuple(python.frame(code, lasti) for code, lasti in stack)


@needs_c
def test_c_cache_names_as_the_python_symbolizer_does() -> None:
    stack = _stack_here() + [(None, 0)]
    named = Symbolizer().name_stack(stack)
    assert named == _python_names(stack)
    assert named[0][0].endswith("test_symbols._stack_here")
    assert named[0][2] == _stack_here.__code__.co_firstlineno + 4  # the f_lasti line
    assert named[-1] == UNKNOWN


@needs_c
def test_a_new_code_object_at_a_dead_ones_address_gets_its_own_name() -> None:
    symbolizer = Symbolizer()  # one for all: its cache outlives each code object
    names = set()
    for i in range(200):
        # Code objects made and dropped: a later one may well take an earlier one's address.
        namespace: dict = {}
        exec(compile(f"def made_{i}():\n    return {i}\n", f"<made {i}>", "exec"), namespace)
        code = namespace[f"made_{i}"].__code__
        names.add(symbolizer.name_stack([(code, 0)])[0][0])
        # Clearing the namespace breaks the function <-> globals cycle: what the symbolizer
        # does not hold goes at once, without a full collection of the test process's heap
        # each time (200 of those took 30 s late in the suite).
        namespace.clear()
        del namespace, code
    assert names == {f"made_{i}" for i in range(200)}


@needs_c
def test_the_cache_keeps_its_codes_alive_and_starts_afresh_when_full() -> None:
    cache = symbols._native.FrameCache(Symbolizer().frame, 8)
    codes = []
    for i in range(20):
        namespace: dict = {}
        exec(f"def f{i}(): pass", namespace)
        codes.append(namespace[f"f{i}"].__code__)
    for code in codes:
        cache.name_stack([(code, 0)])
    assert len(cache) <= 8
    assert cache.stats()["misses"] == 20


@needs_c
def test_symbolizer_and_cache_are_collected_together() -> None:
    symbolizer = Symbolizer()
    symbolizer.name_stack(_stack_here())
    ref = weakref.ref(symbolizer)
    del symbolizer
    gc.collect()
    assert ref() is None  # the cache's namer (a bound method) is a cycle the GC breaks


@needs_c
def test_bad_stacks_raise_type_errors() -> None:
    with pytest.raises(TypeError):
        Symbolizer().name_stack([("not", "a frame", 1)])


def test_the_agents_start_and_stop_are_one_hotspan_frame() -> None:
    """configure's start and shutdown run on the program's thread: a stack through them is
    hotspan's work, one ``hotspan`` frame, not the program's caller."""
    from hotspan.agent.core import Agent
    from hotspan.agent.symbols import AGENT, Symbolizer

    def caller() -> None:
        pass

    for method in (Agent.start, Agent.shutdown, Agent._at_exit):
        stack = ((method.__code__, 0), (caller.__code__, 0))
        assert Symbolizer().name_stack(stack) == (AGENT,), method
