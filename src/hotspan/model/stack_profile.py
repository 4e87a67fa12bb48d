"""One profile held in memory, whole: root-first stacks of frames, each with one value per
sample type.  What the command line reads from and writes to files (pprof, folded, speedscope,
HTML) and what ``hotspan record`` and ``hotspan diff`` work on; the server's columnar
:class:`~hotspan.model.profile.IngestBatch` is for many profiles at once, this is for one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from hotspan.model.profile import Frame

Stack = Tuple[Frame, ...]  # root first


class ProfileSelectError(ValueError):
    """A sample type asked for that the profile does not have."""


@dataclass(frozen=True)
class SampleType:
    type: str  # "cpu", "alloc_space", ...
    unit: str  # "nanoseconds", "bytes", "count"
    name: str = ""  # the profile's metric name ("process_cpu", "memory"); "" when unknown

    @property
    def profile_type_id(self) -> str:
        """The server's id for it, without the period part when unknown."""
        return f"{self.name}:{self.type}:{self.unit}"


@dataclass
class StackProfile:
    sample_types: List[SampleType]
    stacks: Dict[Stack, List[int]] = field(default_factory=dict)
    period_type: Tuple[str, str] = ("", "")
    period: int = 0
    time_ns: int = 0
    duration_ns: int = 0
    default_type: str = ""  # the sample type shown when none is asked for (pprof's)

    def add(self, stack: Sequence[Frame], values: Sequence[int]) -> None:
        """Adds ``values`` (one per sample type) to ``stack`` (root first)."""
        key = tuple(stack)
        if not key:
            return
        current = self.stacks.get(key)
        if current is None:
            self.stacks[key] = list(values)
        else:
            for i, v in enumerate(values):
                current[i] += v

    def merge(self, other: StackProfile) -> None:
        """Adds ``other``'s samples; sample types this profile lacks are appended."""
        index = []
        for st in other.sample_types:
            pos = self.type_position(st)
            if pos is None:
                self.sample_types.append(st)
                for values in self.stacks.values():
                    values.append(0)
                pos = len(self.sample_types) - 1
            index.append(pos)
        width = len(self.sample_types)
        for stack, values in other.stacks.items():
            row = [0] * width
            for src, dst in enumerate(index):
                row[dst] = values[src]
            self.add(stack, row)
        if other.time_ns and (not self.time_ns or other.time_ns < self.time_ns):
            end = max(self.time_ns + self.duration_ns, other.time_ns + other.duration_ns)
            self.time_ns = other.time_ns
            self.duration_ns = end - other.time_ns
        elif other.time_ns:
            end = max(self.time_ns + self.duration_ns, other.time_ns + other.duration_ns)
            self.duration_ns = end - self.time_ns
        if not self.period_type[0] and other.period_type[0]:
            self.period_type, self.period = other.period_type, other.period
        self.default_type = self.default_type or other.default_type

    def type_position(self, wanted: SampleType) -> Optional[int]:
        for i, st in enumerate(self.sample_types):
            if (
                st.type == wanted.type
                and st.unit == wanted.unit
                and (st.name == wanted.name or not st.name or not wanted.name)
            ):
                return i
        return None

    def select(self, wanted: Optional[str] = None) -> int:
        """The position of a sample type by what a user types: ``cpu``, ``alloc_space``,
        ``memory:alloc_space:bytes`` or a full profile type id.

        None: the profile's default type (pprof's ``default_sample_type``), else CPU time
        when it has it, else the last type, as ``go tool pprof`` defaults (Go's CPU profile is
        samples then cpu; its heap ends with inuse_space)."""
        if not self.sample_types:
            raise ProfileSelectError("the profile has no sample types")
        if not wanted:
            for i, st in enumerate(self.sample_types):
                if self.default_type and st.type == self.default_type:
                    return i
            for i, st in enumerate(self.sample_types):
                if st.type == "cpu":
                    return i
            return len(self.sample_types) - 1
        parts = wanted.split(":")
        for i, st in enumerate(self.sample_types):
            if len(parts) == 1 and parts[0] in (st.type, st.name):
                return i
            if len(parts) >= 3 and parts[1:3] == [st.type, st.unit] and parts[0] in (st.name, ""):
                return i
        names = ", ".join(st.type for st in self.sample_types)
        raise ProfileSelectError(f"the profile has no {wanted!r} samples (it has: {names})")

    def values(self, position: int = 0) -> Iterator[Tuple[Stack, int]]:
        """Stacks with a non-zero value of one sample type."""
        for stack, values in self.stacks.items():
            if values[position]:
                yield stack, values[position]

    def total(self, position: int = 0) -> int:
        return sum(values[position] for values in self.stacks.values())

    def only(self, position: int) -> StackProfile:
        """A profile of one sample type."""
        return self.subset([position])

    def subset(self, positions: Sequence[int]) -> StackProfile:
        """A profile of these sample types, in this order (stacks with nothing of them
        left out)."""
        out = StackProfile(
            [self.sample_types[i] for i in positions],
            period_type=self.period_type,
            period=self.period,
            time_ns=self.time_ns,
            duration_ns=self.duration_ns,
        )
        if any(out.sample_types[k].type == self.default_type for k in range(len(positions))):
            out.default_type = self.default_type
        for stack, values in self.stacks.items():
            row = [values[i] for i in positions]
            if any(row):
                out.stacks[stack] = row
        return out


@dataclass(frozen=True)
class FunctionValue:
    name: str
    self_value: int  # in the innermost frame
    total_value: int  # anywhere on the stack (once per stack, recursion included)


def function_values(profile: StackProfile, position: int = 0) -> Dict[str, FunctionValue]:
    """Self and total value of every function (by frame name) for one sample type: what a
    top table shows."""
    self_values: Dict[str, int] = {}
    totals: Dict[str, int] = {}
    for stack, value in profile.values(position):
        leaf = stack[-1].name
        self_values[leaf] = self_values.get(leaf, 0) + value
        for name in {frame.name for frame in stack}:
            totals[name] = totals.get(name, 0) + value
    return {
        name: FunctionValue(name, self_values.get(name, 0), total) for name, total in totals.items()
    }
