"""Encoding the agent's profiles as OTLP profiles (``v1development``), for ``exporter="otlp"``.

:class:`OtlpProfileWriter` has :class:`~hotspan.agent.pprof_writer.ProfileWriter`'s interface
(``add`` a stack with its values and labels, ``encode`` the window) and gives an
``ExportProfilesServiceRequest``: one ``Profile`` per sample type (OTLP's profiles hold one),
sharing one dictionary; the ``span_id`` and ``trace_id`` labels become the sample's link, the
other labels its attributes; the resource carries ``service.name`` and the agent's tags.

It is built with the ``opentelemetry-proto`` package (protobuf), imported only where this
exporter is chosen: about 6 MiB more of the program's memory than the pprof path, which
writes its few fields by hand.
"""

from __future__ import annotations

from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
    ExportProfilesServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.profiles.v1development import profiles_pb2 as pb

from hotspan import __version__

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple, Union

    from hotspan.agent.symbols import FrameInfo

    Labels = Tuple[Tuple[str, str], ...]

# Labels that are the sample's link to its span, not attributes.
LINK_LABELS = ("span_id", "trace_id")


class OtlpProfileWriter:
    def __init__(
        self,
        sample_type: Union[Tuple[str, str], Sequence[Tuple[str, str]]],
        period_type: Tuple[str, str],
        period: int,
        resource: Mapping[str, str],
    ) -> None:
        if isinstance(sample_type[0], str):
            self.sample_types: Tuple[Tuple[str, str], ...] = (sample_type,)  # type: ignore[assignment]
        else:
            self.sample_types = tuple(sample_type)  # type: ignore[arg-type]
        self.period_type = period_type
        self.period = period
        self.resource = dict(resource)
        self._d = pb.ProfilesDictionary()
        # Index 0 of every table is the empty entry, as the format asks.
        self._strings: Dict[str, int] = {}
        # The types first: the encoded dictionary is a copy, taken before encode adds none.
        for text in ("", *(t for pair in (*self.sample_types, period_type) for t in pair)):
            self._string(text)
        self._d.mapping_table.add()
        self._d.location_table.add()
        self._d.function_table.add()
        self._d.link_table.add()
        self._d.attribute_table.add()
        self._d.stack_table.add()
        self._functions: Dict[Tuple[str, str, int], int] = {}
        self._locations: Dict[Tuple[int, int], int] = {}
        self._stacks: Dict[Any, int] = {}
        self._links: Dict[Tuple[str, str], int] = {}
        self._attributes: Dict[Tuple[str, str], int] = {}
        self._label_ids: Dict[Labels, Tuple[Tuple[int, ...], int]] = {}
        self._samples: Dict[Tuple[int, Tuple[int, ...], int], List[int]] = {}

    def _string(self, text: str) -> int:
        index = self._strings.get(text)
        if index is None:
            index = self._strings[text] = len(self._strings)
            self._d.string_table.append(text)
        return index

    def _location(self, frame: FrameInfo) -> int:
        name, filename, line, first_line = frame
        fkey = (name, filename, first_line)
        function = self._functions.get(fkey)
        if function is None:
            function = self._functions[fkey] = len(self._d.function_table)
            self._d.function_table.add(
                name_strindex=self._string(name),
                system_name_strindex=self._string(name),
                filename_strindex=self._string(filename),
                start_line=first_line,
            )
        lkey = (function, line)
        location = self._locations.get(lkey)
        if location is None:
            location = self._locations[lkey] = len(self._d.location_table)
            self._d.location_table.add().lines.add(function_index=function, line=line)
        return location

    def _labels(self, labels: Labels) -> Tuple[Tuple[int, ...], int]:
        """(attribute indexes, link index) of a sample's labels."""
        found = self._label_ids.get(labels)
        if found is not None:
            return found
        attributes = []
        span = trace = ""
        for key, value in labels:
            if key == "span_id":
                span = value
            elif key == "trace_id":
                trace = value
            else:
                akey = (key, value)
                index = self._attributes.get(akey)
                if index is None:
                    index = self._attributes[akey] = len(self._d.attribute_table)
                    self._d.attribute_table.add(
                        key_strindex=self._string(key), value=AnyValue(string_value=value)
                    )
                attributes.append(index)
        link = 0
        if span and trace:
            link = self._links.get((span, trace), 0)
            if not link:
                link = self._links[(span, trace)] = len(self._d.link_table)
                self._d.link_table.add(
                    trace_id=bytes.fromhex(trace.zfill(32)), span_id=bytes.fromhex(span.zfill(16))
                )
        found = self._label_ids[labels] = (tuple(attributes), link)
        return found

    def add(
        self,
        stack: Sequence[FrameInfo],
        value: Union[int, Sequence[int]],
        labels: Labels = (),
        stack_key: Optional[Hashable] = None,
    ) -> None:
        """As :meth:`ProfileWriter.add`: ``stack`` leaf first, a value per sample type."""
        values = (value,) if type(value) is int else tuple(value)  # type: ignore[arg-type]
        if not any(v > 0 for v in values):
            return
        if len(values) != len(self.sample_types):
            raise ValueError(f"{len(values)} values for {len(self.sample_types)} sample types")
        if stack_key is None and isinstance(stack, tuple):
            stack_key = stack
        index = self._stacks.get(stack_key) if stack_key is not None else None
        if index is None:
            index = len(self._d.stack_table)
            self._d.stack_table.add(location_indices=[self._location(f) for f in stack])
            if stack_key is not None:
                self._stacks[stack_key] = index
        attributes, link = self._labels(tuple(labels))
        key = (index, attributes, link)
        total = self._samples.get(key)
        if total is None:
            self._samples[key] = list(values)
        else:
            for i, v in enumerate(values):
                total[i] += v

    def __len__(self) -> int:
        return len(self._samples)

    def encode(self, time_ns: int, duration_ns: int, default_sample_type: str = "") -> bytes:
        """The ExportProfilesServiceRequest of what was added, serialized."""
        request = ExportProfilesServiceRequest()
        request.dictionary.CopyFrom(self._d)
        resource_profiles = request.resource_profiles.add()
        resource_profiles.resource.attributes.extend(
            KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in self.resource.items()
        )
        scope = resource_profiles.scope_profiles.add()
        scope.scope.CopyFrom(InstrumentationScope(name="hotspan", version=__version__))
        for i, (kind, unit) in enumerate(self.sample_types):
            profile = scope.profiles.add(time_unix_nano=time_ns, duration_nano=duration_ns)
            profile.sample_type.type_strindex = self._string(kind)
            profile.sample_type.unit_strindex = self._string(unit)
            profile.period_type.type_strindex = self._string(self.period_type[0])
            profile.period_type.unit_strindex = self._string(self.period_type[1])
            profile.period = self.period
            for (stack, attributes, link), values in self._samples.items():
                if values[i] > 0:
                    profile.samples.add(
                        stack_index=stack,
                        attribute_indices=attributes,
                        link_index=link,
                        values=[values[i]],
                    )
        return request.SerializeToString()
