from hotspan.formats.proto import tempo_common_pb2 as _tempo_common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PartialStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPLETE: _ClassVar[PartialStatus]
    PARTIAL: _ClassVar[PartialStatus]
COMPLETE: PartialStatus
PARTIAL: PartialStatus

class SearchRequest(_message.Message):
    __slots__ = ("Tags", "MinDurationMs", "MaxDurationMs", "Limit", "start", "end", "Query", "SpansPerSpanSet")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TAGS_FIELD_NUMBER: _ClassVar[int]
    MINDURATIONMS_FIELD_NUMBER: _ClassVar[int]
    MAXDURATIONMS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    SPANSPERSPANSET_FIELD_NUMBER: _ClassVar[int]
    Tags: _containers.ScalarMap[str, str]
    MinDurationMs: int
    MaxDurationMs: int
    Limit: int
    start: int
    end: int
    Query: str
    SpansPerSpanSet: int
    def __init__(self, Tags: _Optional[_Mapping[str, str]] = ..., MinDurationMs: _Optional[int] = ..., MaxDurationMs: _Optional[int] = ..., Limit: _Optional[int] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., Query: _Optional[str] = ..., SpansPerSpanSet: _Optional[int] = ...) -> None: ...

class SearchResponse(_message.Message):
    __slots__ = ("traces", "metrics")
    TRACES_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    traces: _containers.RepeatedCompositeFieldContainer[TraceSearchMetadata]
    metrics: SearchMetrics
    def __init__(self, traces: _Optional[_Iterable[_Union[TraceSearchMetadata, _Mapping]]] = ..., metrics: _Optional[_Union[SearchMetrics, _Mapping]] = ...) -> None: ...

class TraceSearchMetadata(_message.Message):
    __slots__ = ("traceID", "rootServiceName", "rootTraceName", "startTimeUnixNano", "durationMs", "spanSet", "spanSets", "serviceStats")
    class ServiceStatsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ServiceStats
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ServiceStats, _Mapping]] = ...) -> None: ...
    TRACEID_FIELD_NUMBER: _ClassVar[int]
    ROOTSERVICENAME_FIELD_NUMBER: _ClassVar[int]
    ROOTTRACENAME_FIELD_NUMBER: _ClassVar[int]
    STARTTIMEUNIXNANO_FIELD_NUMBER: _ClassVar[int]
    DURATIONMS_FIELD_NUMBER: _ClassVar[int]
    SPANSET_FIELD_NUMBER: _ClassVar[int]
    SPANSETS_FIELD_NUMBER: _ClassVar[int]
    SERVICESTATS_FIELD_NUMBER: _ClassVar[int]
    traceID: str
    rootServiceName: str
    rootTraceName: str
    startTimeUnixNano: int
    durationMs: int
    spanSet: SpanSet
    spanSets: _containers.RepeatedCompositeFieldContainer[SpanSet]
    serviceStats: _containers.MessageMap[str, ServiceStats]
    def __init__(self, traceID: _Optional[str] = ..., rootServiceName: _Optional[str] = ..., rootTraceName: _Optional[str] = ..., startTimeUnixNano: _Optional[int] = ..., durationMs: _Optional[int] = ..., spanSet: _Optional[_Union[SpanSet, _Mapping]] = ..., spanSets: _Optional[_Iterable[_Union[SpanSet, _Mapping]]] = ..., serviceStats: _Optional[_Mapping[str, ServiceStats]] = ...) -> None: ...

class ServiceStats(_message.Message):
    __slots__ = ("spanCount", "errorCount")
    SPANCOUNT_FIELD_NUMBER: _ClassVar[int]
    ERRORCOUNT_FIELD_NUMBER: _ClassVar[int]
    spanCount: int
    errorCount: int
    def __init__(self, spanCount: _Optional[int] = ..., errorCount: _Optional[int] = ...) -> None: ...

class SpanSet(_message.Message):
    __slots__ = ("spans", "matched", "attributes")
    SPANS_FIELD_NUMBER: _ClassVar[int]
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    spans: _containers.RepeatedCompositeFieldContainer[Span]
    matched: int
    attributes: _containers.RepeatedCompositeFieldContainer[_tempo_common_pb2.KeyValue]
    def __init__(self, spans: _Optional[_Iterable[_Union[Span, _Mapping]]] = ..., matched: _Optional[int] = ..., attributes: _Optional[_Iterable[_Union[_tempo_common_pb2.KeyValue, _Mapping]]] = ...) -> None: ...

class Span(_message.Message):
    __slots__ = ("spanID", "name", "startTimeUnixNano", "durationNanos", "attributes")
    SPANID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STARTTIMEUNIXNANO_FIELD_NUMBER: _ClassVar[int]
    DURATIONNANOS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    spanID: str
    name: str
    startTimeUnixNano: int
    durationNanos: int
    attributes: _containers.RepeatedCompositeFieldContainer[_tempo_common_pb2.KeyValue]
    def __init__(self, spanID: _Optional[str] = ..., name: _Optional[str] = ..., startTimeUnixNano: _Optional[int] = ..., durationNanos: _Optional[int] = ..., attributes: _Optional[_Iterable[_Union[_tempo_common_pb2.KeyValue, _Mapping]]] = ...) -> None: ...

class SearchMetrics(_message.Message):
    __slots__ = ("inspectedTraces", "inspectedBytes", "totalBlocks", "completedJobs", "totalJobs", "totalBlockBytes", "inspectedSpans", "backendReads", "backendBytes", "additionalMetrics")
    class AdditionalMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    INSPECTEDTRACES_FIELD_NUMBER: _ClassVar[int]
    INSPECTEDBYTES_FIELD_NUMBER: _ClassVar[int]
    TOTALBLOCKS_FIELD_NUMBER: _ClassVar[int]
    COMPLETEDJOBS_FIELD_NUMBER: _ClassVar[int]
    TOTALJOBS_FIELD_NUMBER: _ClassVar[int]
    TOTALBLOCKBYTES_FIELD_NUMBER: _ClassVar[int]
    INSPECTEDSPANS_FIELD_NUMBER: _ClassVar[int]
    BACKENDREADS_FIELD_NUMBER: _ClassVar[int]
    BACKENDBYTES_FIELD_NUMBER: _ClassVar[int]
    ADDITIONALMETRICS_FIELD_NUMBER: _ClassVar[int]
    inspectedTraces: int
    inspectedBytes: int
    totalBlocks: int
    completedJobs: int
    totalJobs: int
    totalBlockBytes: int
    inspectedSpans: int
    backendReads: int
    backendBytes: int
    additionalMetrics: _containers.ScalarMap[str, int]
    def __init__(self, inspectedTraces: _Optional[int] = ..., inspectedBytes: _Optional[int] = ..., totalBlocks: _Optional[int] = ..., completedJobs: _Optional[int] = ..., totalJobs: _Optional[int] = ..., totalBlockBytes: _Optional[int] = ..., inspectedSpans: _Optional[int] = ..., backendReads: _Optional[int] = ..., backendBytes: _Optional[int] = ..., additionalMetrics: _Optional[_Mapping[str, int]] = ...) -> None: ...

class SearchTagsRequest(_message.Message):
    __slots__ = ("scope", "query", "start", "end", "maxTagsPerScope", "staleValuesThreshold")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    MAXTAGSPERSCOPE_FIELD_NUMBER: _ClassVar[int]
    STALEVALUESTHRESHOLD_FIELD_NUMBER: _ClassVar[int]
    scope: str
    query: str
    start: int
    end: int
    maxTagsPerScope: int
    staleValuesThreshold: int
    def __init__(self, scope: _Optional[str] = ..., query: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., maxTagsPerScope: _Optional[int] = ..., staleValuesThreshold: _Optional[int] = ...) -> None: ...

class SearchTagsResponse(_message.Message):
    __slots__ = ("tagNames", "metrics")
    TAGNAMES_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    tagNames: _containers.RepeatedScalarFieldContainer[str]
    metrics: MetadataMetrics
    def __init__(self, tagNames: _Optional[_Iterable[str]] = ..., metrics: _Optional[_Union[MetadataMetrics, _Mapping]] = ...) -> None: ...

class SearchTagsV2Response(_message.Message):
    __slots__ = ("scopes", "metrics")
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    scopes: _containers.RepeatedCompositeFieldContainer[SearchTagsV2Scope]
    metrics: MetadataMetrics
    def __init__(self, scopes: _Optional[_Iterable[_Union[SearchTagsV2Scope, _Mapping]]] = ..., metrics: _Optional[_Union[MetadataMetrics, _Mapping]] = ...) -> None: ...

class SearchTagsV2Scope(_message.Message):
    __slots__ = ("name", "tags")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ...) -> None: ...

class SearchTagValuesRequest(_message.Message):
    __slots__ = ("tagName", "query", "start", "end", "maxTagValues", "staleValueThreshold")
    TAGNAME_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    MAXTAGVALUES_FIELD_NUMBER: _ClassVar[int]
    STALEVALUETHRESHOLD_FIELD_NUMBER: _ClassVar[int]
    tagName: str
    query: str
    start: int
    end: int
    maxTagValues: int
    staleValueThreshold: int
    def __init__(self, tagName: _Optional[str] = ..., query: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., maxTagValues: _Optional[int] = ..., staleValueThreshold: _Optional[int] = ...) -> None: ...

class SearchTagValuesResponse(_message.Message):
    __slots__ = ("tagValues", "metrics")
    TAGVALUES_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    tagValues: _containers.RepeatedScalarFieldContainer[str]
    metrics: MetadataMetrics
    def __init__(self, tagValues: _Optional[_Iterable[str]] = ..., metrics: _Optional[_Union[MetadataMetrics, _Mapping]] = ...) -> None: ...

class TagValue(_message.Message):
    __slots__ = ("type", "value")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    type: str
    value: str
    def __init__(self, type: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class SearchTagValuesV2Response(_message.Message):
    __slots__ = ("tagValues", "metrics")
    TAGVALUES_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    tagValues: _containers.RepeatedCompositeFieldContainer[TagValue]
    metrics: MetadataMetrics
    def __init__(self, tagValues: _Optional[_Iterable[_Union[TagValue, _Mapping]]] = ..., metrics: _Optional[_Union[MetadataMetrics, _Mapping]] = ...) -> None: ...

class MetadataMetrics(_message.Message):
    __slots__ = ("inspectedBytes", "totalJobs", "completedJobs", "totalBlocks", "totalBlockBytes", "backendReads", "backendBytes", "additionalMetrics")
    class AdditionalMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    INSPECTEDBYTES_FIELD_NUMBER: _ClassVar[int]
    TOTALJOBS_FIELD_NUMBER: _ClassVar[int]
    COMPLETEDJOBS_FIELD_NUMBER: _ClassVar[int]
    TOTALBLOCKS_FIELD_NUMBER: _ClassVar[int]
    TOTALBLOCKBYTES_FIELD_NUMBER: _ClassVar[int]
    BACKENDREADS_FIELD_NUMBER: _ClassVar[int]
    BACKENDBYTES_FIELD_NUMBER: _ClassVar[int]
    ADDITIONALMETRICS_FIELD_NUMBER: _ClassVar[int]
    inspectedBytes: int
    totalJobs: int
    completedJobs: int
    totalBlocks: int
    totalBlockBytes: int
    backendReads: int
    backendBytes: int
    additionalMetrics: _containers.ScalarMap[str, int]
    def __init__(self, inspectedBytes: _Optional[int] = ..., totalJobs: _Optional[int] = ..., completedJobs: _Optional[int] = ..., totalBlocks: _Optional[int] = ..., totalBlockBytes: _Optional[int] = ..., backendReads: _Optional[int] = ..., backendBytes: _Optional[int] = ..., additionalMetrics: _Optional[_Mapping[str, int]] = ...) -> None: ...

class QueryRangeRequest(_message.Message):
    __slots__ = ("query", "start", "end", "step", "queryMode", "exemplars", "maxSeries", "instant")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    QUERYMODE_FIELD_NUMBER: _ClassVar[int]
    EXEMPLARS_FIELD_NUMBER: _ClassVar[int]
    MAXSERIES_FIELD_NUMBER: _ClassVar[int]
    INSTANT_FIELD_NUMBER: _ClassVar[int]
    query: str
    start: int
    end: int
    step: int
    queryMode: str
    exemplars: int
    maxSeries: int
    instant: bool
    def __init__(self, query: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., step: _Optional[int] = ..., queryMode: _Optional[str] = ..., exemplars: _Optional[int] = ..., maxSeries: _Optional[int] = ..., instant: bool = ...) -> None: ...

class QueryRangeResponse(_message.Message):
    __slots__ = ("series", "metrics", "status", "message")
    SERIES_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    series: _containers.RepeatedCompositeFieldContainer[TimeSeries]
    metrics: SearchMetrics
    status: PartialStatus
    message: str
    def __init__(self, series: _Optional[_Iterable[_Union[TimeSeries, _Mapping]]] = ..., metrics: _Optional[_Union[SearchMetrics, _Mapping]] = ..., status: _Optional[_Union[PartialStatus, str]] = ..., message: _Optional[str] = ...) -> None: ...

class Exemplar(_message.Message):
    __slots__ = ("labels", "value", "timestamp_ms")
    LABELS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedCompositeFieldContainer[_tempo_common_pb2.KeyValue]
    value: float
    timestamp_ms: int
    def __init__(self, labels: _Optional[_Iterable[_Union[_tempo_common_pb2.KeyValue, _Mapping]]] = ..., value: _Optional[float] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class Sample(_message.Message):
    __slots__ = ("timestamp_ms", "value")
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    timestamp_ms: int
    value: float
    def __init__(self, timestamp_ms: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...

class TimeSeries(_message.Message):
    __slots__ = ("labels", "samples", "exemplars")
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    EXEMPLARS_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedCompositeFieldContainer[_tempo_common_pb2.KeyValue]
    samples: _containers.RepeatedCompositeFieldContainer[Sample]
    exemplars: _containers.RepeatedCompositeFieldContainer[Exemplar]
    def __init__(self, labels: _Optional[_Iterable[_Union[_tempo_common_pb2.KeyValue, _Mapping]]] = ..., samples: _Optional[_Iterable[_Union[Sample, _Mapping]]] = ..., exemplars: _Optional[_Iterable[_Union[Exemplar, _Mapping]]] = ...) -> None: ...

class QueryInstantRequest(_message.Message):
    __slots__ = ("query", "start", "end")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    query: str
    start: int
    end: int
    def __init__(self, query: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class QueryInstantResponse(_message.Message):
    __slots__ = ("series", "metrics", "status", "message")
    SERIES_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    series: _containers.RepeatedCompositeFieldContainer[InstantSeries]
    metrics: SearchMetrics
    status: PartialStatus
    message: str
    def __init__(self, series: _Optional[_Iterable[_Union[InstantSeries, _Mapping]]] = ..., metrics: _Optional[_Union[SearchMetrics, _Mapping]] = ..., status: _Optional[_Union[PartialStatus, str]] = ..., message: _Optional[str] = ...) -> None: ...

class InstantSeries(_message.Message):
    __slots__ = ("labels", "value")
    LABELS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedCompositeFieldContainer[_tempo_common_pb2.KeyValue]
    value: float
    def __init__(self, labels: _Optional[_Iterable[_Union[_tempo_common_pb2.KeyValue, _Mapping]]] = ..., value: _Optional[float] = ...) -> None: ...
