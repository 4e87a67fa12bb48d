from hotspan.formats.proto import profile_pb2 as _profile_pb2
from hotspan.formats.proto import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProfileFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROFILE_FORMAT_UNSPECIFIED: _ClassVar[ProfileFormat]
    PROFILE_FORMAT_FLAMEGRAPH: _ClassVar[ProfileFormat]
    PROFILE_FORMAT_TREE: _ClassVar[ProfileFormat]
    PROFILE_FORMAT_DOT: _ClassVar[ProfileFormat]
    PROFILE_FORMAT_PPROF: _ClassVar[ProfileFormat]

class AsyncQueryType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ASYNC_QUERY_TYPE_DISABLED: _ClassVar[AsyncQueryType]
    ASYNC_QUERY_TYPE_FORCE: _ClassVar[AsyncQueryType]

class AsyncQueryStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ASYNC_QUERY_STATUS_UNKNOWN: _ClassVar[AsyncQueryStatus]
    ASYNC_QUERY_STATUS_IN_PROGRESS: _ClassVar[AsyncQueryStatus]
    ASYNC_QUERY_STATUS_SUCCESS: _ClassVar[AsyncQueryStatus]
    ASYNC_QUERY_STATUS_FAILURE: _ClassVar[AsyncQueryStatus]

class HeatmapQueryType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HEATMAP_QUERY_TYPE_UNSPECIFIED: _ClassVar[HeatmapQueryType]
    HEATMAP_QUERY_TYPE_INDIVIDUAL: _ClassVar[HeatmapQueryType]
    HEATMAP_QUERY_TYPE_SPAN: _ClassVar[HeatmapQueryType]
PROFILE_FORMAT_UNSPECIFIED: ProfileFormat
PROFILE_FORMAT_FLAMEGRAPH: ProfileFormat
PROFILE_FORMAT_TREE: ProfileFormat
PROFILE_FORMAT_DOT: ProfileFormat
PROFILE_FORMAT_PPROF: ProfileFormat
ASYNC_QUERY_TYPE_DISABLED: AsyncQueryType
ASYNC_QUERY_TYPE_FORCE: AsyncQueryType
ASYNC_QUERY_STATUS_UNKNOWN: AsyncQueryStatus
ASYNC_QUERY_STATUS_IN_PROGRESS: AsyncQueryStatus
ASYNC_QUERY_STATUS_SUCCESS: AsyncQueryStatus
ASYNC_QUERY_STATUS_FAILURE: AsyncQueryStatus
HEATMAP_QUERY_TYPE_UNSPECIFIED: HeatmapQueryType
HEATMAP_QUERY_TYPE_INDIVIDUAL: HeatmapQueryType
HEATMAP_QUERY_TYPE_SPAN: HeatmapQueryType

class ProfileTypesRequest(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class ProfileTypesResponse(_message.Message):
    __slots__ = ("profile_types",)
    PROFILE_TYPES_FIELD_NUMBER: _ClassVar[int]
    profile_types: _containers.RepeatedCompositeFieldContainer[_types_pb2.ProfileType]
    def __init__(self, profile_types: _Optional[_Iterable[_Union[_types_pb2.ProfileType, _Mapping]]] = ...) -> None: ...

class SeriesRequest(_message.Message):
    __slots__ = ("matchers", "label_names", "start", "end")
    MATCHERS_FIELD_NUMBER: _ClassVar[int]
    LABEL_NAMES_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    matchers: _containers.RepeatedScalarFieldContainer[str]
    label_names: _containers.RepeatedScalarFieldContainer[str]
    start: int
    end: int
    def __init__(self, matchers: _Optional[_Iterable[str]] = ..., label_names: _Optional[_Iterable[str]] = ..., start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class SeriesResponse(_message.Message):
    __slots__ = ("labels_set",)
    LABELS_SET_FIELD_NUMBER: _ClassVar[int]
    labels_set: _containers.RepeatedCompositeFieldContainer[_types_pb2.Labels]
    def __init__(self, labels_set: _Optional[_Iterable[_Union[_types_pb2.Labels, _Mapping]]] = ...) -> None: ...

class AsyncQueryRequest(_message.Message):
    __slots__ = ("request_id", "type")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    type: AsyncQueryType
    def __init__(self, request_id: _Optional[str] = ..., type: _Optional[_Union[AsyncQueryType, str]] = ...) -> None: ...

class AsyncQueryResponse(_message.Message):
    __slots__ = ("request_id", "status", "error_message")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    status: AsyncQueryStatus
    error_message: str
    def __init__(self, request_id: _Optional[str] = ..., status: _Optional[_Union[AsyncQueryStatus, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class SelectMergeStacktracesRequest(_message.Message):
    __slots__ = ("profile_typeID", "label_selector", "start", "end", "max_nodes", "format", "stack_trace_selector", "profile_id_selector", "trace_id_selector", "span_selector")
    PROFILE_TYPEID_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    MAX_NODES_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    STACK_TRACE_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    PROFILE_ID_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    ASYNC_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    SPAN_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    profile_typeID: str
    label_selector: str
    start: int
    end: int
    max_nodes: int
    format: ProfileFormat
    stack_trace_selector: _types_pb2.StackTraceSelector
    profile_id_selector: _containers.RepeatedScalarFieldContainer[str]
    trace_id_selector: _containers.RepeatedScalarFieldContainer[str]
    span_selector: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, profile_typeID: _Optional[str] = ..., label_selector: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., max_nodes: _Optional[int] = ..., format: _Optional[_Union[ProfileFormat, str]] = ..., stack_trace_selector: _Optional[_Union[_types_pb2.StackTraceSelector, _Mapping]] = ..., profile_id_selector: _Optional[_Iterable[str]] = ..., trace_id_selector: _Optional[_Iterable[str]] = ..., span_selector: _Optional[_Iterable[str]] = ..., **kwargs) -> None: ...

class SelectMergeStacktracesResponse(_message.Message):
    __slots__ = ("flamegraph", "tree", "dot", "pprof")
    FLAMEGRAPH_FIELD_NUMBER: _ClassVar[int]
    TREE_FIELD_NUMBER: _ClassVar[int]
    DOT_FIELD_NUMBER: _ClassVar[int]
    ASYNC_FIELD_NUMBER: _ClassVar[int]
    PPROF_FIELD_NUMBER: _ClassVar[int]
    flamegraph: FlameGraph
    tree: bytes
    dot: str
    pprof: PprofProfile
    def __init__(self, flamegraph: _Optional[_Union[FlameGraph, _Mapping]] = ..., tree: _Optional[bytes] = ..., dot: _Optional[str] = ..., pprof: _Optional[_Union[PprofProfile, _Mapping]] = ..., **kwargs) -> None: ...

class PprofProfile(_message.Message):
    __slots__ = ("profile",)
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    profile: _profile_pb2.Profile
    def __init__(self, profile: _Optional[_Union[_profile_pb2.Profile, _Mapping]] = ...) -> None: ...

class SelectMergeSpanProfileRequest(_message.Message):
    __slots__ = ("profile_typeID", "label_selector", "span_selector", "start", "end", "max_nodes", "format", "include_descendants")
    PROFILE_TYPEID_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    SPAN_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    MAX_NODES_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_DESCENDANTS_FIELD_NUMBER: _ClassVar[int]
    profile_typeID: str
    label_selector: str
    span_selector: _containers.RepeatedScalarFieldContainer[str]
    start: int
    end: int
    max_nodes: int
    format: ProfileFormat
    include_descendants: bool
    def __init__(self, profile_typeID: _Optional[str] = ..., label_selector: _Optional[str] = ..., span_selector: _Optional[_Iterable[str]] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., max_nodes: _Optional[int] = ..., format: _Optional[_Union[ProfileFormat, str]] = ..., include_descendants: bool = ...) -> None: ...

class SelectMergeSpanProfileResponse(_message.Message):
    __slots__ = ("flamegraph", "tree")
    FLAMEGRAPH_FIELD_NUMBER: _ClassVar[int]
    TREE_FIELD_NUMBER: _ClassVar[int]
    flamegraph: FlameGraph
    tree: bytes
    def __init__(self, flamegraph: _Optional[_Union[FlameGraph, _Mapping]] = ..., tree: _Optional[bytes] = ...) -> None: ...

class DiffRequest(_message.Message):
    __slots__ = ("left", "right")
    LEFT_FIELD_NUMBER: _ClassVar[int]
    RIGHT_FIELD_NUMBER: _ClassVar[int]
    left: SelectMergeStacktracesRequest
    right: SelectMergeStacktracesRequest
    def __init__(self, left: _Optional[_Union[SelectMergeStacktracesRequest, _Mapping]] = ..., right: _Optional[_Union[SelectMergeStacktracesRequest, _Mapping]] = ...) -> None: ...

class DiffResponse(_message.Message):
    __slots__ = ("flamegraph",)
    FLAMEGRAPH_FIELD_NUMBER: _ClassVar[int]
    flamegraph: FlameGraphDiff
    def __init__(self, flamegraph: _Optional[_Union[FlameGraphDiff, _Mapping]] = ...) -> None: ...

class FlameGraph(_message.Message):
    __slots__ = ("names", "levels", "total", "max_self")
    NAMES_FIELD_NUMBER: _ClassVar[int]
    LEVELS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    MAX_SELF_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    levels: _containers.RepeatedCompositeFieldContainer[Level]
    total: int
    max_self: int
    def __init__(self, names: _Optional[_Iterable[str]] = ..., levels: _Optional[_Iterable[_Union[Level, _Mapping]]] = ..., total: _Optional[int] = ..., max_self: _Optional[int] = ...) -> None: ...

class FlameGraphDiff(_message.Message):
    __slots__ = ("names", "levels", "total", "max_self", "leftTicks", "rightTicks")
    NAMES_FIELD_NUMBER: _ClassVar[int]
    LEVELS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    MAX_SELF_FIELD_NUMBER: _ClassVar[int]
    LEFTTICKS_FIELD_NUMBER: _ClassVar[int]
    RIGHTTICKS_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    levels: _containers.RepeatedCompositeFieldContainer[Level]
    total: int
    max_self: int
    leftTicks: int
    rightTicks: int
    def __init__(self, names: _Optional[_Iterable[str]] = ..., levels: _Optional[_Iterable[_Union[Level, _Mapping]]] = ..., total: _Optional[int] = ..., max_self: _Optional[int] = ..., leftTicks: _Optional[int] = ..., rightTicks: _Optional[int] = ...) -> None: ...

class Level(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, values: _Optional[_Iterable[int]] = ...) -> None: ...

class SelectMergeProfileRequest(_message.Message):
    __slots__ = ("profile_typeID", "label_selector", "start", "end", "max_nodes", "stack_trace_selector", "profile_id_selector", "trace_id_selector")
    PROFILE_TYPEID_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    MAX_NODES_FIELD_NUMBER: _ClassVar[int]
    STACK_TRACE_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    PROFILE_ID_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    profile_typeID: str
    label_selector: str
    start: int
    end: int
    max_nodes: int
    stack_trace_selector: _types_pb2.StackTraceSelector
    profile_id_selector: _containers.RepeatedScalarFieldContainer[str]
    trace_id_selector: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, profile_typeID: _Optional[str] = ..., label_selector: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., max_nodes: _Optional[int] = ..., stack_trace_selector: _Optional[_Union[_types_pb2.StackTraceSelector, _Mapping]] = ..., profile_id_selector: _Optional[_Iterable[str]] = ..., trace_id_selector: _Optional[_Iterable[str]] = ...) -> None: ...

class SelectSeriesRequest(_message.Message):
    __slots__ = ("profile_typeID", "label_selector", "start", "end", "group_by", "step", "aggregation", "stack_trace_selector", "limit", "exemplar_type", "trace_id_selector", "span_selector")
    PROFILE_TYPEID_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    GROUP_BY_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    AGGREGATION_FIELD_NUMBER: _ClassVar[int]
    STACK_TRACE_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    EXEMPLAR_TYPE_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    SPAN_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    profile_typeID: str
    label_selector: str
    start: int
    end: int
    group_by: _containers.RepeatedScalarFieldContainer[str]
    step: float
    aggregation: _types_pb2.TimeSeriesAggregationType
    stack_trace_selector: _types_pb2.StackTraceSelector
    limit: int
    exemplar_type: _types_pb2.ExemplarType
    trace_id_selector: _containers.RepeatedScalarFieldContainer[str]
    span_selector: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, profile_typeID: _Optional[str] = ..., label_selector: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., group_by: _Optional[_Iterable[str]] = ..., step: _Optional[float] = ..., aggregation: _Optional[_Union[_types_pb2.TimeSeriesAggregationType, str]] = ..., stack_trace_selector: _Optional[_Union[_types_pb2.StackTraceSelector, _Mapping]] = ..., limit: _Optional[int] = ..., exemplar_type: _Optional[_Union[_types_pb2.ExemplarType, str]] = ..., trace_id_selector: _Optional[_Iterable[str]] = ..., span_selector: _Optional[_Iterable[str]] = ...) -> None: ...

class SelectSeriesResponse(_message.Message):
    __slots__ = ("series",)
    SERIES_FIELD_NUMBER: _ClassVar[int]
    series: _containers.RepeatedCompositeFieldContainer[_types_pb2.Series]
    def __init__(self, series: _Optional[_Iterable[_Union[_types_pb2.Series, _Mapping]]] = ...) -> None: ...

class SelectHeatmapRequest(_message.Message):
    __slots__ = ("profile_typeID", "label_selector", "start", "end", "step", "group_by", "query_type", "exemplar_type", "limit")
    PROFILE_TYPEID_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    GROUP_BY_FIELD_NUMBER: _ClassVar[int]
    QUERY_TYPE_FIELD_NUMBER: _ClassVar[int]
    EXEMPLAR_TYPE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    profile_typeID: str
    label_selector: str
    start: int
    end: int
    step: float
    group_by: _containers.RepeatedScalarFieldContainer[str]
    query_type: HeatmapQueryType
    exemplar_type: _types_pb2.ExemplarType
    limit: int
    def __init__(self, profile_typeID: _Optional[str] = ..., label_selector: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., step: _Optional[float] = ..., group_by: _Optional[_Iterable[str]] = ..., query_type: _Optional[_Union[HeatmapQueryType, str]] = ..., exemplar_type: _Optional[_Union[_types_pb2.ExemplarType, str]] = ..., limit: _Optional[int] = ...) -> None: ...

class SelectHeatmapResponse(_message.Message):
    __slots__ = ("series",)
    SERIES_FIELD_NUMBER: _ClassVar[int]
    series: _containers.RepeatedCompositeFieldContainer[_types_pb2.HeatmapSeries]
    def __init__(self, series: _Optional[_Iterable[_Union[_types_pb2.HeatmapSeries, _Mapping]]] = ...) -> None: ...

class AnalyzeQueryRequest(_message.Message):
    __slots__ = ("start", "end", "query")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    query: str
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ..., query: _Optional[str] = ...) -> None: ...

class AnalyzeQueryResponse(_message.Message):
    __slots__ = ("query_scopes", "query_impact")
    QUERY_SCOPES_FIELD_NUMBER: _ClassVar[int]
    QUERY_IMPACT_FIELD_NUMBER: _ClassVar[int]
    query_scopes: _containers.RepeatedCompositeFieldContainer[QueryScope]
    query_impact: QueryImpact
    def __init__(self, query_scopes: _Optional[_Iterable[_Union[QueryScope, _Mapping]]] = ..., query_impact: _Optional[_Union[QueryImpact, _Mapping]] = ...) -> None: ...

class QueryScope(_message.Message):
    __slots__ = ("component_type", "component_count", "block_count", "series_count", "profile_count", "sample_count", "index_bytes", "profile_bytes", "symbol_bytes")
    COMPONENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    COMPONENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    BLOCK_COUNT_FIELD_NUMBER: _ClassVar[int]
    SERIES_COUNT_FIELD_NUMBER: _ClassVar[int]
    PROFILE_COUNT_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_COUNT_FIELD_NUMBER: _ClassVar[int]
    INDEX_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROFILE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SYMBOL_BYTES_FIELD_NUMBER: _ClassVar[int]
    component_type: str
    component_count: int
    block_count: int
    series_count: int
    profile_count: int
    sample_count: int
    index_bytes: int
    profile_bytes: int
    symbol_bytes: int
    def __init__(self, component_type: _Optional[str] = ..., component_count: _Optional[int] = ..., block_count: _Optional[int] = ..., series_count: _Optional[int] = ..., profile_count: _Optional[int] = ..., sample_count: _Optional[int] = ..., index_bytes: _Optional[int] = ..., profile_bytes: _Optional[int] = ..., symbol_bytes: _Optional[int] = ...) -> None: ...

class QueryImpact(_message.Message):
    __slots__ = ("total_bytes_in_time_range", "total_queried_series", "deduplication_needed")
    TOTAL_BYTES_IN_TIME_RANGE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_QUERIED_SERIES_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATION_NEEDED_FIELD_NUMBER: _ClassVar[int]
    total_bytes_in_time_range: int
    total_queried_series: int
    deduplication_needed: bool
    def __init__(self, total_bytes_in_time_range: _Optional[int] = ..., total_queried_series: _Optional[int] = ..., deduplication_needed: bool = ...) -> None: ...
