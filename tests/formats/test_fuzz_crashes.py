"""Every input the fuzzer ever found a bug with (tests/fuzz/crashes/<target>/), and every seed
(tests/fuzz/corpus/<target>/), through its fuzz target: each must now decode, or be refused
with an error the server answers with a 4xx, quickly.  The fuzzing itself is
tests/fuzz/run.py (scripts/test.sh runs it for a minute); this replays in a second or two."""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Tuple

import pytest

from tests.fuzz import targets

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"
# Inputs are a few KiB; the slowest seed takes ~10 ms.  Generous for a loaded machine, far
# below what the fuzzer's hangs took.
SECONDS_PER_INPUT = 2.0


def inputs(kind: str) -> List[Tuple[str, Path]]:
    out = []
    for directory in sorted((FUZZ / kind).glob("*")):
        if directory.name in targets.TARGETS:
            out.extend((directory.name, path) for path in sorted(directory.iterdir()))
    return out


def _replay(target: str, path: Path) -> None:
    if target not in targets.available():
        pytest.skip("the C extension hotspan._speedups._pprof is not built")
    data = path.read_bytes()
    started = time.perf_counter()
    targets.TARGETS[target](data)  # raises on anything but a clean refusal or a valid decode
    took = time.perf_counter() - started
    assert took < SECONDS_PER_INPUT, f"{path.name} took {took:.1f} s"


@pytest.mark.parametrize(
    "target,path", inputs("crashes"), ids=lambda v: v.name if isinstance(v, Path) else v
)
def test_crash_inputs_decode_or_are_refused(target: str, path: Path) -> None:
    _replay(target, path)


@pytest.mark.parametrize(
    "target,path", inputs("corpus"), ids=lambda v: v.name if isinstance(v, Path) else v
)
def test_seed_inputs_decode_or_are_refused(target: str, path: Path) -> None:
    _replay(target, path)


def test_every_target_has_seeds() -> None:
    seeded = {target for target, _ in inputs("corpus")}
    assert seeded == set(targets.TARGETS)
