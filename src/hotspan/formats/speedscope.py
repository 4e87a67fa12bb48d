"""speedscope JSON (https://www.speedscope.app/file-format-schema.json): read sampled and
evented profiles, write sampled ones."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Dict, Hashable, List, Tuple

from hotspan.formats.errors import FormatError
from hotspan.model.profile import MAX_SAMPLE_VALUE, Frame
from hotspan.model.stack_profile import SampleType, StackProfile

TIME_UNITS = {
    "nanoseconds": 1,
    "microseconds": 1_000,
    "milliseconds": 1_000_000,
    "seconds": 1_000_000_000,
}
UNITS = set(TIME_UNITS) | {"bytes", "none"}
SCHEMA = "https://www.speedscope.app/file-format-schema.json"
# pprof sample units as speedscope names them; anything else is a plain number.
_TO_SPEEDSCOPE = {**{u: u for u in TIME_UNITS}, "bytes": "bytes"}


@dataclass
class SpeedscopeProfile:
    name: str
    unit: str
    stacks: Dict[Tuple[str, ...], float]  # root-first frame names -> weight in ``unit``


def parse(data: bytes) -> List[SpeedscopeProfile]:
    return [
        SpeedscopeProfile(name, unit, stacks)
        for name, unit, stacks in _parse(data, lambda f: str(f.get("name", "")))
    ]


def _parse(
    data: bytes, frame_key: Callable[[dict], Hashable]
) -> List[Tuple[str, str, Dict[tuple, float]]]:
    """(name, unit, stacks) per profile name and unit; a stack is a root-first tuple of
    ``frame_key(shared frame)``."""
    try:
        doc = json.loads(data)
        frames = [frame_key(f) for f in doc["shared"]["frames"]]
        profiles = doc["profiles"]
    except RecursionError:
        raise FormatError("not a speedscope file: nested too deeply") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FormatError(f"not a speedscope file: {exc}") from None
    if not isinstance(profiles, list):
        raise FormatError("not a speedscope file: profiles is not a list")
    out: Dict[Tuple[str, str], Tuple[str, str, Dict[tuple, float]]] = {}
    for prof in profiles:
        if not isinstance(prof, dict):
            raise FormatError("speedscope profile is not an object")
        unit = str(prof.get("unit", "none"))
        if unit not in UNITS:
            raise FormatError(f"speedscope unit {unit!r} is not one of {sorted(UNITS)}")
        name = str(prof.get("name", ""))
        merged = out.setdefault((name, unit), (name, unit, {}))
        kind = prof.get("type")
        try:
            if kind == "sampled":
                _sampled(prof, frames, merged[2])
            elif kind == "evented":
                _evented(prof, frames, merged[2])
            else:
                raise FormatError(f"speedscope profile type {kind!r} is not sampled or evented")
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            if isinstance(exc, FormatError):
                raise
            raise FormatError(f"malformed speedscope profile {name!r}: {exc!r}") from None
    return list(out.values())


def _index(i: object, frames: List[Any]) -> int:
    if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(frames):
        raise FormatError(f"frame index {i!r} is not one of the {len(frames)} frames")
    return i


def _sampled(prof: dict, frames: List[Any], into: Dict[tuple, float]) -> None:
    samples, weights = prof["samples"], prof["weights"]
    if len(samples) != len(weights):
        raise FormatError(f"{len(samples)} samples but {len(weights)} weights")
    for sample, weight in zip(samples, weights):
        if not isinstance(weight, (int, float)) or not 0 <= weight <= MAX_SAMPLE_VALUE:
            raise FormatError(f"weight {weight!r} is not a number between 0 and {MAX_SAMPLE_VALUE}")
        key = tuple(frames[_index(i, frames)] for i in sample)
        if key:
            into[key] = into.get(key, 0) + weight


def _evented(prof: dict, frames: List[Any], into: Dict[tuple, float]) -> None:
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


def write_speedscope(profile: StackProfile, name: str = "") -> bytes:
    """Every sample type as one "sampled" profile over shared frames (name, file, line), as
    speedscope.app opens it.  Each profile is named by its sample type id so that
    :func:`read_speedscope` gets the sample types back."""
    frame_index: Dict[Frame, int] = {}
    frames: List[dict] = []
    profiles = []
    for position, st in enumerate(profile.sample_types):
        samples: List[List[int]] = []
        weights: List[int] = []
        for stack, value in sorted(profile.values(position), key=lambda sv: sv[0]):
            row = []
            for frame in stack:
                index = frame_index.get(frame)
                if index is None:
                    index = frame_index[frame] = len(frames)
                    frames.append(_frame_json(frame))
                row.append(index)
            samples.append(row)
            weights.append(value)
        total = sum(weights)
        profiles.append(
            {
                "type": "sampled",
                "name": st.profile_type_id if st.name else st.type,
                "unit": _TO_SPEEDSCOPE.get(st.unit, "none"),
                "startValue": 0,
                "endValue": total,
                "samples": samples,
                "weights": weights,
            }
        )
    doc = {
        "$schema": SCHEMA,
        "name": name or "hotspan profile",
        "exporter": "hotspan",
        "activeProfileIndex": 0,
        "shared": {"frames": frames},
        "profiles": profiles,
    }
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


def _frame_json(frame: Frame) -> dict:
    out: Dict[str, Any] = {"name": frame.name}
    if frame.filename:
        out["file"] = frame.filename
    if frame.line:
        out["line"] = frame.line
    return out


def _frame(f: dict) -> Frame:
    line = f.get("line")
    return Frame(
        str(f.get("name", "")),
        str(f.get("file") or ""),
        line if isinstance(line, int) and not isinstance(line, bool) and line > 0 else 0,
    )


def read_speedscope(data: bytes) -> StackProfile:
    """A speedscope file as one profile: a sample type per speedscope profile name and unit.
    Times become nanoseconds; weights are rounded to integers."""
    parsed = _parse(data, _frame)
    if not parsed:
        raise FormatError("the speedscope file has no profiles")
    types = [_sample_type(name, unit) for name, unit, _ in parsed]
    if len(set(types)) != len(types):
        # Two profiles that map to one sample type: give each its own, by position.
        types = [SampleType(f"{t.type}_{i}", t.unit, t.name) for i, t in enumerate(types)]
    out = StackProfile(types)
    width = len(types)
    for position, (_, unit, stacks) in enumerate(parsed):
        scale = TIME_UNITS.get(unit, 1)
        for stack, weight in stacks.items():
            value = int(round(weight * scale))
            if value:
                row = [0] * width
                row[position] = value
                out.add(stack, row)
    if out.sample_types and out.sample_types[0].unit == "nanoseconds":
        out.period_type = (out.sample_types[0].type, "nanoseconds")
    return out


# Units a type id of ours may end with that speedscope writes as another ("objects": "none").
_TYPE_ID_UNITS = ("count", "objects", "samples")


def _sample_type(name: str, unit: str) -> SampleType:
    our_unit = "nanoseconds" if unit in TIME_UNITS else ("bytes" if unit == "bytes" else "count")
    parts = name.split(":")
    # Our own files name profiles by sample type id ("process_cpu:cpu:nanoseconds"), in the
    # unit the type had ("wall:wall:milliseconds", "memory:alloc_objects:objects").
    if len(parts) >= 3 and parts[1] and parts[2] in (our_unit, unit, *_TYPE_ID_UNITS):
        return SampleType(parts[1], our_unit, parts[0])
    default = {"nanoseconds": "cpu", "bytes": "space", "count": "samples"}[our_unit]
    return SampleType(name if name and ":" not in name and " " not in name else default, our_unit)
