"""speedscope JSON (https://www.speedscope.app/file-format-schema.json), sampled and evented."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Dict, List, Tuple

from hotspan.formats.errors import FormatError
from hotspan.model.profile import MAX_SAMPLE_VALUE

TIME_UNITS = {
    "nanoseconds": 1,
    "microseconds": 1_000,
    "milliseconds": 1_000_000,
    "seconds": 1_000_000_000,
}
UNITS = set(TIME_UNITS) | {"bytes", "none"}


@dataclass
class SpeedscopeProfile:
    name: str
    unit: str
    stacks: Dict[Tuple[str, ...], float]  # root-first frame names -> weight in ``unit``


def parse(data: bytes) -> List[SpeedscopeProfile]:
    try:
        doc = json.loads(data)
        frames = [str(f.get("name", "")) for f in doc["shared"]["frames"]]
        profiles = doc["profiles"]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FormatError(f"not a speedscope file: {exc}") from None
    out: Dict[Tuple[str, str], SpeedscopeProfile] = {}
    for prof in profiles:
        if not isinstance(prof, dict):
            raise FormatError("speedscope profile is not an object")
        unit = str(prof.get("unit", "none"))
        if unit not in UNITS:
            raise FormatError(f"speedscope unit {unit!r} is not one of {sorted(UNITS)}")
        name = str(prof.get("name", ""))
        merged = out.setdefault((name, unit), SpeedscopeProfile(name, unit, {}))
        kind = prof.get("type")
        try:
            if kind == "sampled":
                _sampled(prof, frames, merged.stacks)
            elif kind == "evented":
                _evented(prof, frames, merged.stacks)
            else:
                raise FormatError(f"speedscope profile type {kind!r} is not sampled or evented")
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            if isinstance(exc, FormatError):
                raise
            raise FormatError(f"malformed speedscope profile {name!r}: {exc!r}") from None
    return list(out.values())


def _index(i: object, frames: List[str]) -> int:
    if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(frames):
        raise FormatError(f"frame index {i!r} is not one of the {len(frames)} frames")
    return i


def _sampled(prof: dict, frames: List[str], into: Dict[Tuple[str, ...], float]) -> None:
    samples, weights = prof["samples"], prof["weights"]
    if len(samples) != len(weights):
        raise FormatError(f"{len(samples)} samples but {len(weights)} weights")
    for sample, weight in zip(samples, weights):
        if not isinstance(weight, (int, float)) or not 0 <= weight <= MAX_SAMPLE_VALUE:
            raise FormatError(f"weight {weight!r} is not a number between 0 and {MAX_SAMPLE_VALUE}")
        key = tuple(frames[_index(i, frames)] for i in sample)
        if key:
            into[key] = into.get(key, 0) + weight


def _evented(prof: dict, frames: List[str], into: Dict[Tuple[str, ...], float]) -> None:
    open_stack: List[int] = []
    last = prof.get("startValue", 0)
    for event in prof["events"]:
        at = event["at"]
        if not isinstance(at, (int, float)) or not 0 <= at <= MAX_SAMPLE_VALUE:
            raise FormatError(f"event time {at!r} is out of range")
        if at < last:
            raise FormatError("speedscope events are not in time order")
        if open_stack and at > last:
            key = tuple(frames[_index(i, frames)] for i in open_stack)
            into[key] = into.get(key, 0) + (at - last)
        last = at
        if event["type"] == "O":
            open_stack.append(int(event["frame"]))
        elif event["type"] == "C":
            if not open_stack or open_stack[-1] != event["frame"]:
                raise FormatError("speedscope close event does not match the open frame")
            open_stack.pop()
        else:
            raise FormatError(f"speedscope event type {event['type']!r} is not O or C")
