"""OTLP profiles (``v1development``) in over OTLP/HTTP and OTLP/gRPC, against a real server.

Requests are built with the ``opentelemetry-proto`` classes.  Their dictionary follows the spec
(entry 0 of every table is the zero value) unless a test says otherwise.  Pyroscope's own OTLP
ingest tests (``pkg/ingester/otlp/ingest_handler_test.go``) are mirrored where they apply; their
expected outputs, in ../shared, are compared when present.  Unlike Pyroscope's tests, every
profile here is stamped with a real time: hotspan refuses times before the year 2000.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
from typing import Dict, List, Optional, Sequence, Tuple, Union

import grpc
import httpx
import pytest
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc import status_pb2
from opentelemetry.proto.collector.profiles.v1development import (
    profiles_service_pb2,
    profiles_service_pb2_grpc,
)
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.profiles.v1development import profiles_pb2

from tests.conftest import RunningServer, shared_fixture, start_server
from tests.helpers import CPU, QUERIER, TLS, flamegraph, function_totals

Request = profiles_service_pb2.ExportProfilesServiceRequest
Response = profiles_service_pb2.ExportProfilesServiceResponse

T0 = 1_700_000_000  # 2023-11-14: each test stamps its data at its own offset from here
NS = 10**9
PERIOD = 50_000_000  # 20 Hz, the OpenTelemetry eBPF profiler's default
PATH = "/v1development/profiles"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
EXPORT = "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export"
PYROSCOPE_TESTDATA = "ingester/otlp/testdata/"
TRACE_A = "0af7651916cd43dd8448eb211c80319c"
SPAN_A = "b7ad6b7169203331"
TRACE_B = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN_B = "f1e2d3c4b5a69788"  # high bit set: span ids are unsigned


# --- building requests -------------------------------------------------------------------


def any_value(value: Union[str, int]) -> common_pb2.AnyValue:
    if isinstance(value, int):
        return common_pb2.AnyValue(int_value=value)
    return common_pb2.AnyValue(string_value=value)


class Builder:
    """An ``ExportProfilesServiceRequest`` and its shared dictionary, entries deduplicated.

    ``zero_entries=False`` lays the tables out as Pyroscope's test builder does: no zero value
    first, so index 0 is a real string, function, location, stack and attribute."""

    def __init__(self, zero_entries: bool = True) -> None:
        self.msg = Request()
        self.d = self.msg.dictionary
        self._strings: Dict[str, int] = {}
        self._functions: Dict[Tuple[str, str], int] = {}
        self._locations: Dict[Tuple, int] = {}
        self._stacks: Dict[Tuple[int, ...], int] = {}
        self._scope: Optional[profiles_pb2.ScopeProfiles] = None
        if zero_entries:
            self.s("")
            d = self.d
            for table in (d.mapping_table, d.location_table, d.function_table, d.link_table):
                table.add()
            d.attribute_table.add()
            d.stack_table.add()

    def s(self, text: str) -> int:
        if text not in self._strings:
            self._strings[text] = len(self.d.string_table)
            self.d.string_table.append(text)
        return self._strings[text]

    def function(self, name: str, filename: str = "") -> int:
        key = (name, filename)
        if key not in self._functions:
            self._functions[key] = len(self.d.function_table)
            self.d.function_table.add(
                name_strindex=self.s(name),
                system_name_strindex=self.s(name),
                filename_strindex=self.s(filename),
            )
        return self._functions[key]

    def mapping(self, filename: str, start: int = 0x1000, limit: int = 0x2000) -> int:
        self.d.mapping_table.add(
            memory_start=start, memory_limit=limit, filename_strindex=self.s(filename)
        )
        return len(self.d.mapping_table) - 1

    def location(
        self, *lines: Tuple[str, int], mapping: int = 0, address: int = 0, filename: str = ""
    ) -> int:
        """``lines``: (function, line number), innermost first: a function inlined into its
        caller comes before the caller, as the spec orders ``Location.lines``."""
        key = (lines, mapping, address, filename)
        if key not in self._locations:
            self._locations[key] = len(self.d.location_table)
            loc = self.d.location_table.add(mapping_index=mapping, address=address)
            for name, line in lines:
                loc.lines.add(function_index=self.function(name, filename), line=line)
        return self._locations[key]

    def stack(self, *locations: int) -> int:
        """``locations``: leaf first."""
        if locations not in self._stacks:
            self._stacks[locations] = len(self.d.stack_table)
            self.d.stack_table.add(location_indices=locations)
        return self._stacks[locations]

    def frames(self, *names: str) -> int:
        """A stack of one-line locations, given leaf first."""
        return self.stack(*(self.location((name, 0)) for name in names))

    def attr(self, key: str, value: Union[str, int]) -> int:
        self.d.attribute_table.add(key_strindex=self.s(key), value=any_value(value))
        return len(self.d.attribute_table) - 1

    def link(self, trace_id: str, span_id: str) -> int:
        self.d.link_table.add(trace_id=bytes.fromhex(trace_id), span_id=bytes.fromhex(span_id))
        return len(self.d.link_table) - 1

    def profile(
        self,
        resource: Optional[Dict[str, Union[str, int]]] = None,
        scope: Optional[Dict[str, Union[str, int]]] = None,
        sample_type: Tuple[str, str] = ("samples", "count"),
        period_type: Optional[Tuple[str, str]] = ("cpu", "nanoseconds"),
        period: int = PERIOD,
        time_ns: int = T0 * NS,
        attributes: Sequence[int] = (),
        same_scope: bool = False,
    ) -> profiles_pb2.Profile:
        """A new profile, in a new resource and scope unless ``same_scope``."""
        if not same_scope or self._scope is None:
            rp = self.msg.resource_profiles.add()
            for k, v in (resource or {}).items():
                rp.resource.attributes.add(key=k, value=any_value(v))
            self._scope = rp.scope_profiles.add()
            self._scope.scope.name = "tests"
            for k, v in (scope or {}).items():
                self._scope.scope.attributes.add(key=k, value=any_value(v))
        p = self._scope.profiles.add()
        p.sample_type.type_strindex = self.s(sample_type[0])
        p.sample_type.unit_strindex = self.s(sample_type[1])
        if period_type is not None:
            p.period_type.type_strindex = self.s(period_type[0])
            p.period_type.unit_strindex = self.s(period_type[1])
        p.period = period
        p.time_unix_nano = time_ns
        p.duration_nano = 10 * NS
        p.attribute_indices.extend(attributes)
        return p

    def pb(self) -> bytes:
        return self.msg.SerializeToString()

    def json(self) -> bytes:
        return otlp_json(self.msg)


def otlp_json(msg: Request) -> bytes:
    """OTLP/JSON: protobuf's JSON mapping, but trace and span ids in hex, not base64."""

    def hex_ids(node):  # type: ignore[no-untyped-def]
        if isinstance(node, dict):
            return {
                k: base64.b64decode(v).hex()
                if k in ("traceId", "spanId", "profileId")
                else hex_ids(v)
                for k, v in node.items()
            }
        if isinstance(node, list):
            return [hex_ids(v) for v in node]
        return node

    return json.dumps(hex_ids(json_format.MessageToDict(msg))).encode()


def cpu_request(service: str, t: int, weight: int = 1) -> Builder:
    """A small eBPF-profiler-like CPU profile: main;work;hot x3 and main x1 (times weight)."""
    b = Builder()
    p = b.profile(resource={"service.name": service}, time_ns=t * NS)
    p.samples.add(stack_index=b.frames("hot", "work", "main"), values=[3 * weight])
    p.samples.add(stack_index=b.frames("main"), values=[weight])
    return b


def cpu_totals(weight: int = 1) -> Dict[str, int]:
    return {"main": 4 * weight * PERIOD, "work": 3 * weight * PERIOD, "hot": 3 * weight * PERIOD}


# --- sending -----------------------------------------------------------------------------


def post(
    url: str,
    body: bytes,
    ctype: str = PROTOBUF,
    headers: Optional[Dict[str, str]] = None,
    compress: bool = False,
) -> httpx.Response:
    all_headers = {"content-type": ctype, **(headers or {})}
    if compress:
        body = gzip.compress(body)
        all_headers["content-encoding"] = "gzip"
    return httpx.post(url + PATH, content=body, headers=all_headers, timeout=30, verify=TLS)


def http_ok(url: str, body: bytes, **kwargs) -> Response:  # type: ignore[no-untyped-def]
    """Post and parse the answer, in whichever encoding the request used."""
    r = post(url, body, **kwargs)
    assert r.status_code == 200, (r.status_code, r.content[:300])
    ctype = kwargs.get("ctype", PROTOBUF)
    assert r.headers["content-type"].startswith(ctype)
    if ctype == JSON:
        return json_format.Parse(r.content, Response())
    return Response.FromString(r.content)


def http_status(r: httpx.Response) -> status_pb2.Status:
    """The ``google.rpc.Status`` of an OTLP/HTTP error, in the request's encoding."""
    if r.headers["content-type"].startswith(JSON):
        return json_format.Parse(r.content, status_pb2.Status(), ignore_unknown_fields=True)
    return status_pb2.Status.FromString(r.content)


def grpc_export(address: str, msg: Request, metadata: Sequence[Tuple[str, str]] = ()) -> Response:
    with grpc.insecure_channel(address) as channel:
        stub = profiles_service_pb2_grpc.ProfilesServiceStub(channel)
        return stub.Export(msg, metadata=metadata, timeout=30)


def grpc_raw(address: str, body: bytes, metadata: Sequence[Tuple[str, str]] = ()) -> Response:
    """Export with a body sent as is, even one that is not a valid message."""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(EXPORT, response_deserializer=Response.FromString)
        return call(body, metadata=metadata, timeout=30)


def grpc_error(
    address: str, body: bytes, metadata: Sequence[Tuple[str, str]] = ()
) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        grpc_raw(address, body, metadata)
    return info.value


# --- querying ----------------------------------------------------------------------------


def stacks_of(graph: dict) -> Dict[Tuple[str, ...], int]:
    """Self value of every root-first path of a flame graph (the stacks that were stored)."""
    names = graph.get("names", [])
    out: Dict[Tuple[str, ...], int] = {}
    parents: List[Tuple[int, int, Tuple[str, ...]]] = [(0, 1 << 63, ())]
    for level in graph.get("levels", [])[1:]:
        values = [int(v) for v in level.get("values", [])]
        nodes = []
        end = 0
        for i in range(0, len(values), 4):
            x = end + values[i]
            total, self_value, name = values[i + 1], values[i + 2], names[values[i + 3]]
            end = x + total
            parent = next(p for p in parents if p[0] <= x < p[0] + p[1])
            path = parent[2] + (name,)
            nodes.append((x, total, path))
            if self_value:
                out[path] = out.get(path, 0) + self_value
        parents = nodes
    return out


def query(c: httpx.Client, method: str, body: dict, headers: Optional[dict] = None) -> dict:
    r = c.post(f"{QUERIER}/{method}", json=body, headers=headers or {})
    assert r.status_code == 200, r.text
    return r.json()


def window(t: int, before: int = 60, after: int = 60) -> Dict[str, int]:
    return {"start": (t - before) * 1000, "end": (t + after) * 1000}


def label_names(c: httpx.Client, t: int, matcher: str) -> List[str]:
    return query(c, "LabelNames", {"matchers": [matcher], **window(t)}).get("names", [])


def label_values(c: httpx.Client, t: int, name: str, matcher: str = "{}") -> List[str]:
    body = {"name": name, "matchers": [matcher], **window(t)}
    return query(c, "LabelValues", body).get("names", [])


def series(c: httpx.Client, t: int, matcher: str) -> List[Dict[str, str]]:
    found = query(c, "Series", {"matchers": [matcher], **window(t)}).get("labelsSet", [])
    return sorted(
        # (protobuf's JSON leaves out empty strings)
        ({p.get("name", ""): p.get("value", "") for p in s["labels"]} for s in found),
        key=lambda labels: sorted(labels.items()),
    )


def profile_types(c: httpx.Client, t: int, headers: Optional[dict] = None) -> List[str]:
    types = query(c, "ProfileTypes", window(t), headers).get("profileTypes", [])
    return sorted(p["ID"] for p in types)


def graph_at(c: httpx.Client, selector: str, t: int, **extra) -> dict:  # type: ignore[no-untyped-def]
    return flamegraph(c, selector, t - 60, t + 60, **extra)


@pytest.fixture(scope="module")
def srv(module_server: RunningServer) -> RunningServer:
    assert module_server.otlp_http_url and module_server.otlp_grpc_address
    return module_server


# --- 1. an eBPF-profiler CPU profile -----------------------------------------------------


def test_ebpf_cpu_profile_lands_as_process_cpu_with_root_first_stacks(srv) -> None:  # type: ignore[no-untyped-def]
    t = T0 + 1000
    b = Builder()
    p = b.profile(resource={"service.name": "ebpf-app"}, time_ns=t * NS)
    # One location holds `parse` inlined into `handle` (innermost line first).
    inlined = b.location(("parse", 42), ("handle", 17), filename="app.py")
    serve = b.location(("serve", 5), filename="app.py")
    main = b.location(("main", 1), filename="app.py")
    libc = b.location(mapping=b.mapping("libc.so.6"), address=0x9F3A0)  # unsymbolized leaf
    p.samples.add(stack_index=b.stack(inlined, serve, main), values=[3])
    p.samples.add(stack_index=b.stack(libc, serve, main), values=[2])
    p.samples.add(stack_index=b.stack(main), values=[1])
    assert http_ok(srv.url, b.pb()) == Response()  # no partial_success: all stored

    with httpx.Client(base_url=srv.url, timeout=30, verify=TLS) as c:
        assert CPU in profile_types(c, t)
        graph = graph_at(c, '{service_name="ebpf-app"}', t)
        # samples x period: 6 samples at 50 ms each.
        assert graph["total"] == str(6 * PERIOD)
        assert stacks_of(graph) == {
            ("main", "serve", "handle", "parse"): 3 * PERIOD,
            ("main", "serve", "libc.so.6 0x9f3a0"): 2 * PERIOD,
            ("main",): 1 * PERIOD,
        }
        assert function_totals(graph) == {
            "main": 6 * PERIOD,
            "serve": 5 * PERIOD,
            "handle": 3 * PERIOD,
            "parse": 3 * PERIOD,
            "libc.so.6 0x9f3a0": 2 * PERIOD,
        }
        # Nothing stored outside the profile's time.
        assert stacks_of(flamegraph(c, '{service_name="ebpf-app"}', t + 60, t + 120)) == {}


def test_other_sample_types_keep_their_values_and_type(srv) -> None:  # type: ignore[no-untyped-def]
    """Not the eBPF pair: no scaling, the profile type built from the sample and period types."""
    t = T0 + 1100
    b = Builder()
    p = b.profile(
        resource={"service.name": "heap-app"},
        sample_type=("alloc_space", "bytes"),
        period_type=("space", "bytes"),
        period=524288,
        time_ns=t * NS,
    )
    p.samples.add(stack_index=b.frames("alloc", "main"), values=[4096])
    assert http_ok(srv.url, b.pb()) == Response()
    with httpx.Client(base_url=srv.url, timeout=30, verify=TLS) as c:
        space = "memory:alloc_space:bytes:space:bytes"
        assert space in profile_types(c, t)
        graph = graph_at(c, '{service_name="heap-app"}', t, profile_type=space)
        assert stacks_of(graph) == {("main", "alloc"): 4096}


# --- 2. labels ---------------------------------------------------------------------------


def test_resource_scope_profile_and_sample_attributes_become_labels(srv) -> None:  # type: ignore[no-untyped-def]
    t = T0 + 2000
    b = Builder()
    pod = b.attr("k8s.pod.name", "web-1")
    p = b.profile(
        resource={"service.name": "labelled", "host.name": "node-7", "process.pid": 4242},
        scope={"profiler.version": "v0.9"},
        attributes=[pod],
        time_ns=t * NS,
    )
    cpu7 = b.attr("cpu.logical_number", 7)
    cpu0 = b.attr("cpu.logical_number", 0)
    thread = b.attr("thread.name", "worker")
    # A sample attribute wins over the resource's service.name ...
    moved = b.attr("service.name", "labelled-sidecar")
    # ... and over other resource attributes of the same name.
    host = b.attr("host.name", "node-override")
    p.samples.add(stack_index=b.frames("a", "main"), values=[1], attribute_indices=[cpu7, thread])
    p.samples.add(stack_index=b.frames("b", "main"), values=[2], attribute_indices=[cpu0])
    p.samples.add(stack_index=b.frames("c", "main"), values=[5], attribute_indices=[moved, host])
    assert http_ok(srv.url, b.pb()) == Response()

    with httpx.Client(base_url=srv.url, timeout=30, verify=TLS) as c:
        common = {
            "__name__": "process_cpu",
            "__profile_type__": CPU,
            "__type__": "cpu",
            "__unit__": "nanoseconds",
            "__period_type__": "cpu",
            "__period_unit__": "nanoseconds",
            "profiler.version": "v0.9",
            "k8s.pod.name": "web-1",
            "process.pid": "4242",
        }
        found = series(c, t, '{service_name=~"labelled.*"}')
        for labels in found:  # the receiver names itself; no other label is added
            assert labels.pop("pyroscope_spy", "otlp") == "otlp"
        assert found == sorted(
            [
                {
                    **common,
                    "service_name": "labelled",
                    "host.name": "node-7",
                    "cpu.logical_number": "0",
                },
                {
                    **common,
                    "service_name": "labelled",
                    "host.name": "node-7",
                    "cpu.logical_number": "7",
                    "thread.name": "worker",
                },
                {**common, "service_name": "labelled-sidecar", "host.name": "node-override"},
            ],
            key=lambda labels: sorted(labels.items()),
        )
        assert "service.name" not in label_names(c, t, '{service_name=~"labelled.*"}')
        assert {"cpu.logical_number", "host.name", "thread.name", "process.pid"} <= set(
            label_names(c, t, '{service_name="labelled"}')
        )
        assert label_values(c, t, "cpu.logical_number", '{service_name="labelled"}') == ["0", "7"]
        assert label_values(c, t, "service_name", '{host.name=~"node-.*"}') == [
            "labelled",
            "labelled-sidecar",
        ]
        # Label selectors pick the samples of each series.
        by_cpu = graph_at(c, '{service_name="labelled", cpu.logical_number="7"}', t)
        assert stacks_of(by_cpu) == {("main", "a"): PERIOD}
        sidecar = graph_at(c, '{service_name="labelled-sidecar"}', t)
        assert stacks_of(sidecar) == {("main", "c"): 5 * PERIOD}
        assert stacks_of(graph_at(c, '{process.pid="4242"}', t)) == {
            ("main", "a"): PERIOD,
            ("main", "b"): 2 * PERIOD,
            ("main", "c"): 5 * PERIOD,
        }


def _different_service_names(zero_entries: bool, t: int) -> Builder:
    """Pyroscope's TestDifferentServiceNames input: three samples, two with a service.name
    sample attribute, one without; service-c's stack repeats its one location."""
    b = Builder(zero_entries)
    maps = [
        b.mapping("service-a.so", 0x1000, 0x2000),
        b.mapping("service-b.so", 0x2000, 0x3000),
        b.mapping("service-c.so", 0x4000, 0x5000),
    ]
    locs = [
        b.location(
            ("serviceA_func1", 10), mapping=maps[0], address=0x1100, filename="service_a.go"
        ),
        b.location(
            ("serviceA_func2", 20), mapping=maps[0], address=0x1200, filename="service_a.go"
        ),
        b.location(
            ("serviceB_func1", 30), mapping=maps[1], address=0x2100, filename="service_b.go"
        ),
        b.location(
            ("serviceB_func2", 40), mapping=maps[1], address=0x2200, filename="service_b.go"
        ),
        b.location(("serviceC_func3", 50), mapping=maps[2], address=0xEF0, filename="service_c.go"),
    ]
    stacks = [b.stack(locs[0], locs[1]), b.stack(locs[2], locs[3]), b.stack(locs[4], locs[4])]
    svc_a, svc_b = b.attr("service.name", "service-a"), b.attr("service.name", "service-b")
    p = b.profile(period=10_000_000, time_ns=t * NS)
    p.samples.add(stack_index=stacks[0], values=[100], attribute_indices=[svc_a])
    p.samples.add(stack_index=stacks[1], values=[200], attribute_indices=[svc_b])
    p.samples.add(stack_index=stacks[2], values=[700])
    return b


@pytest.mark.parametrize("layout", ["spec", "pyroscope-builder"])
def test_different_service_names(srv, layout: str) -> None:  # type: ignore[no-untyped-def]
    t = T0 + 2100 + (0 if layout == "spec" else 200)
    tenant = {"X-Scope-OrgID": f"svcnames-{layout}"}
    b = _different_service_names(layout == "spec", t)
    assert http_ok(srv.url, b.pb(), headers=tenant) == Response()
    with httpx.Client(base_url=srv.url, timeout=30, headers=tenant, verify=TLS) as c:
        assert profile_types(c, t) == [CPU]
        assert label_values(c, t, "service_name") == ["service-a", "service-b", "unknown_service"]
        assert "service.name" not in label_names(c, t, "{}")
        ms10 = 10_000_000
        expected = {
            "service-a": {("serviceA_func2", "serviceA_func1"): 100 * ms10},
            "service-b": {("serviceB_func2", "serviceB_func1"): 200 * ms10},
            "unknown_service": {("serviceC_func3", "serviceC_func3"): 700 * ms10},
        }
        for service, stacks in expected.items():
            assert stacks_of(graph_at(c, f'{{service_name="{service}"}}', t)) == stacks, service


def test_missing_service_name_is_unknown_service(srv) -> None:  # type: ignore[no-untyped-def]
    t = T0 + 2500
    b = Builder()
    # An empty service.name and a non-label value (a double) count as missing.
    p = b.profile(resource={"service.name": "", "env": "lab"}, time_ns=t * NS)
    p.samples.add(stack_index=b.frames("orphan"), values=[1])
    d = b.attr("service.name", "ignored")
    b.d.attribute_table[d].value.CopyFrom(common_pb2.AnyValue(double_value=1.5))
    p.samples.add(stack_index=b.frames("orphan2"), values=[1], attribute_indices=[d])
    assert http_ok(srv.url, b.pb()) == Response()
    with httpx.Client(base_url=srv.url, timeout=30, verify=TLS) as c:
        assert label_values(c, t, "service_name", '{env="lab"}') == ["unknown_service"]
        assert function_totals(graph_at(c, '{env="lab"}', t)) == {
            "orphan": PERIOD,
            "orphan2": PERIOD,
        }


def _pyroscope_expected(name: str) -> dict:
    return json.loads(shared_fixture(PYROSCOPE_TESTDATA + name).read_text())


def _expected_stacks(doc: dict) -> Dict[Tuple[str, ...], int]:
    """Root-first stacks of a profile as Pyroscope's strprofile prints it, named as hotspan
    names frames: the function of each line, or "<binary> <address>" when unsymbolized."""
    out: Dict[Tuple[str, ...], int] = {}
    for sample in doc["samples"]:
        leaf_first: List[str] = []
        for loc in sample["locations"]:
            lines = loc.get("lines") or []
            if lines:
                leaf_first += [line.split("[")[0] for line in lines]
            else:
                binary = re.fullmatch(r"\S+ (.*)\(.*\)", loc["mapping"]).group(1)  # type: ignore[union-attr]
                leaf_first.append(f"{binary} {loc['address']}")
        path = tuple(reversed(leaf_first))
        out[path] = out.get(path, 0) + int(sample["values"])
    return out


@pytest.mark.parametrize(
    "service, fixture",
    [
        ("service-a", "TestDifferentServiceNames_service_a_profile.json"),
        ("service-b", "TestDifferentServiceNames_service_b_profile.json"),
        ("unknown_service", "TestDifferentServiceNames_unknown_profile.json"),
    ],
)
def test_different_service_names_match_pyroscope(srv, service: str, fixture: str) -> None:  # type: ignore[no-untyped-def]
    doc = _pyroscope_expected(fixture)
    # Each case pushes the request into a time window of its own.
    t = T0 + 2600 + {"service-a": 0, "service-b": 100, "unknown_service": 200}[service]
    tenant = {"X-Scope-OrgID": "svcnames-conformance"}
    assert http_ok(srv.url, _different_service_names(True, t).pb(), headers=tenant) == Response()
    # Pyroscope too turns samples:count over a cpu:nanoseconds period into cpu:nanoseconds.
    assert [(st["type"], st["unit"]) for st in doc["sample_types"]] == [("cpu", "nanoseconds")]
    assert doc["period"] == "10000000"
    with httpx.Client(base_url=srv.url, timeout=30, headers=tenant, verify=TLS) as c:
        assert profile_types(c, t) == [CPU]
        graph = graph_at(c, f'{{service_name="{service}"}}', t)
        assert stacks_of(graph) == _expected_stacks(doc)
        assert int(graph["total"]) == sum(int(s["values"]) for s in doc["samples"])


def test_sample_attributes_match_pyroscope(srv) -> None:  # type: ignore[no-untyped-def]
    """Pyroscope's TestSampleAttributes input: unsymbolized firefox and chrome stacks with
    process and cpu.logical_number sample attributes.  Pyroscope keeps them as pprof labels;
    hotspan makes them series labels, so each sample is a series of its own."""
    doc = _pyroscope_expected("TestSampleAttributes.json")
    t = T0 + 3000
    tenant = {"X-Scope-OrgID": "sample-attributes"}
    b = Builder()
    firefox, chrome = (
        b.mapping("firefox.so", 0x1000, 0x1000),
        b.mapping("chrome.so", 0x1000, 0x1000),
    )
    locs = [
        b.location(mapping=firefox, address=0x1E),
        b.location(mapping=firefox, address=0x2E),
        b.location(mapping=chrome, address=0x3E),
        b.location(mapping=chrome, address=0x4E),
    ]
    attrs = [
        b.attr("process", "firefox"),
        b.attr("process", "chrome"),
        b.attr("cpu.logical_number", 0),
        b.attr("cpu.logical_number", 7),
    ]
    p = b.profile(sample_type=("samples", "ms"), period_type=None, period=0, time_ns=t * NS)
    p.samples.add(
        stack_index=b.stack(locs[0], locs[1]), values=[0xEF], attribute_indices=[attrs[0], attrs[2]]
    )
    p.samples.add(
        stack_index=b.stack(locs[2], locs[3]),
        values=[0xEFEF],
        attribute_indices=[attrs[1], attrs[3]],
    )
    assert http_ok(srv.url, b.pb(), headers=tenant) == Response()

    ptype = "process_cpu:samples:ms::"
    with httpx.Client(base_url=srv.url, timeout=30, headers=tenant, verify=TLS) as c:
        assert profile_types(c, t) == [ptype]
        for sample in doc["samples"]:
            labels = dict(pair.split("=", 1) for pair in sample["labels"].split(","))
            selector = "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
            graph = graph_at(c, selector, t, profile_type=ptype)
            assert stacks_of(graph) == _expected_stacks({"samples": [sample]}), selector
        assert label_values(c, t, "process") == ["chrome", "firefox"]
        assert label_values(c, t, "service_name") == ["unknown_service"]


def _unsymbolized(off_cpu: bool, t: int) -> Builder:
    """Pyroscope's TestConversionOffCpu / TestSymbolizedFunctionNames inputs: addresses in
    file1.so without lines; off-CPU has a sample with six values and no timestamps."""
    b = Builder()
    lib = b.mapping("file1.so", 0x1000, 0x1000)
    locs = [b.location(mapping=lib, address=a) for a in (0x1E0, 0x2F0, 0x3F0)]
    sample_type = ("off_cpu", "nanoseconds") if off_cpu else ("samples", "ms")
    p = b.profile(sample_type=sample_type, period_type=None, period=0, time_ns=t * NS)
    p.samples.add(stack_index=b.stack(locs[0], locs[1]), values=[0xEF])
    if off_cpu:
        p.samples.add(stack_index=b.stack(locs[2]), values=[1, 2, 3, 4, 5, 6])
    return b


@pytest.mark.parametrize(
    "fixture", ["TestSymbolizedFunctionNames.json", "TestConversionOffCpu.json"]
)
def test_unsymbolized_profiles_match_pyroscope(srv, fixture: str) -> None:  # type: ignore[no-untyped-def]
    doc = _pyroscope_expected(fixture)
    off_cpu = "OffCpu" in fixture
    t = T0 + 3100 + (100 if off_cpu else 0)
    tenant = {"X-Scope-OrgID": fixture[: -len(".json")]}
    assert http_ok(srv.url, _unsymbolized(off_cpu, t).pb(), headers=tenant) == Response()
    with httpx.Client(base_url=srv.url, timeout=30, headers=tenant, verify=TLS) as c:
        types = profile_types(c, t)
        assert len(types) == 1
        sample_type = doc["sample_types"][0]
        assert types[0].split(":")[1:] == [sample_type["type"], sample_type["unit"], "", ""]
        graph = graph_at(c, "{}", t, profile_type=types[0])
        # Six values without timestamps add up to one point (1+...+6 = 21), as in Pyroscope.
        assert stacks_of(graph) == _expected_stacks(doc)


def test_off_cpu_profile_type_is_named_as_in_pyroscope(srv) -> None:  # type: ignore[no-untyped-def]
    t = T0 + 3300
    tenant = {"X-Scope-OrgID": "off-cpu-name"}
    assert http_ok(srv.url, _unsymbolized(True, t).pb(), headers=tenant) == Response()
    with httpx.Client(base_url=srv.url, timeout=30, headers=tenant, verify=TLS) as c:
        assert profile_types(c, t) == ["off_cpu:off_cpu:nanoseconds::"]


def test_attribute_with_an_empty_key_is_no_label(srv) -> None:  # type: ignore[no-untyped-def]
    t = T0 + 3400
    tenant = {"X-Scope-OrgID": "empty-key"}
    b = cpu_request("empty-key", t)
    nameless = b.attr("", "value")  # key_strindex 0: the empty string
    b.msg.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].attribute_indices.append(
        nameless
    )
    post(srv.url, b.pb(), headers=tenant)  # refusing the profile would be right as well
    with httpx.Client(base_url=srv.url, timeout=30, headers=tenant, verify=TLS) as c:
        assert "" not in label_names(c, t, "{}")


# --- 3. links and sample timestamps ------------------------------------------------------


def _linked_request(service: str, t: int) -> Builder:
    """Samples linked to two spans of two traces, one unlinked, and one sample whose two
    timestamps are ten minutes apart."""
    b = Builder()
    p = b.profile(resource={"service.name": service}, time_ns=t * NS)
    link_a, link_b = b.link(TRACE_A, SPAN_A), b.link(TRACE_B, SPAN_B)
    p.samples.add(stack_index=b.frames("in_span_a", "main"), values=[2], link_index=link_a)
    p.samples.add(stack_index=b.frames("in_span_b", "main"), values=[3], link_index=link_b)
    p.samples.add(stack_index=b.frames("no_span", "main"), values=[4])
    p.samples.add(
        stack_index=b.frames("periodic", "main"),
        values=[5, 7],
        timestamps_unix_nano=[(t + 1) * NS, (t + 601) * NS],
    )
    # No values: every timestamp is one event.
    p.samples.add(
        stack_index=b.frames("events", "main"),
        timestamps_unix_nano=[(t + 2) * NS, (t + 3) * NS, (t + 602) * NS],
    )
    return b


LINKED_EARLY = {
    ("main", "in_span_a"): 2 * PERIOD,
    ("main", "in_span_b"): 3 * PERIOD,
    ("main", "no_span"): 4 * PERIOD,
    ("main", "periodic"): 5 * PERIOD,
    ("main", "events"): 2 * PERIOD,
}
LINKED_LATE = {("main", "periodic"): 7 * PERIOD, ("main", "events"): PERIOD}


def _check_linked(c: httpx.Client, service: str, t: int, headers: Optional[dict] = None) -> None:
    selector = f'{{service_name="{service}"}}'
    early = flamegraph(c, selector, t - 10, t + 60, headers=headers)
    assert stacks_of(early) == LINKED_EARLY
    late = flamegraph(c, selector, t + 590, t + 620, headers=headers)
    assert stacks_of(late) == LINKED_LATE
    for trace, span, stack in (
        (TRACE_A, SPAN_A, ("main", "in_span_a")),
        (TRACE_B, SPAN_B, ("main", "in_span_b")),
    ):
        r = c.post(
            f"{QUERIER}/SelectMergeSpanProfile",
            json={
                "profileTypeID": CPU,
                "labelSelector": selector,
                "spanSelector": [span],
                **window(t, 10, 700),
            },
            headers=headers or {},
        )
        assert r.status_code == 200, r.text
        assert stacks_of(r.json()["flamegraph"]) == {stack: LINKED_EARLY[stack]}
        traced = flamegraph(c, selector, t - 10, t + 700, headers=headers, traceIdSelector=[trace])
        assert stacks_of(traced) == {stack: LINKED_EARLY[stack]}


def test_links_and_per_sample_timestamps(srv) -> None:  # type: ignore[no-untyped-def]
    t = T0 + 4000
    assert http_ok(srv.url, _linked_request("linked", t).pb()) == Response()
    with httpx.Client(base_url=srv.url, timeout=30, verify=TLS) as c:
        _check_linked(c, "linked", t)
        # A span or trace nobody sent finds nothing.
        r = c.post(
            f"{QUERIER}/SelectMergeSpanProfile",
            json={
                "profileTypeID": CPU,
                "labelSelector": "{}",
                "spanSelector": ["00000000000000ff"],
                **window(t, 10, 700),
            },
        )
        assert r.status_code == 200 and stacks_of(r.json()["flamegraph"]) == {}
        # SelectSeries in one-minute steps: the samples' own times put them in two steps ten
        # minutes apart (the profile's time would have put everything in the first).
        body = {
            "profileTypeID": CPU,
            "labelSelector": '{service_name="linked"}',
            "start": (t - 30) * 1000,
            "end": (t + 660) * 1000,
            "step": 60,
        }
        found = query(c, "SelectSeries", body)["series"]
        assert len(found) == 1
        points = [(int(p["timestamp"]), p["value"]) for p in found[0]["points"]]
        assert [value for _, value in points] == [
            float(sum(LINKED_EARLY.values())),
            float(sum(LINKED_LATE.values())),
        ]
        assert points[1][0] - points[0][0] == 600_000
        assert (t - 30) * 1000 <= points[0][0] <= (t + 60) * 1000


# --- 4. every transport --------------------------------------------------------------------


TRANSPORTS = [
    "protobuf",
    "json",
    "protobuf-gzip",
    "json-gzip",
    "otlp-port",
    "otlp-port-json",
    "grpc",
]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_transport_stores_the_same(srv, transport: str) -> None:  # type: ignore[no-untyped-def]
    t = T0 + 5000
    service = f"via-{transport}"
    b = _linked_request(service, t)
    if transport == "grpc":
        assert grpc_export(srv.otlp_grpc_address, b.msg) == Response()
    else:
        url = srv.otlp_http_url if transport.startswith("otlp-port") else srv.url
        is_json = transport.endswith("json") or transport.startswith("json")
        body = b.json() if is_json else b.pb()
        if is_json:  # ids in hex, as OTLP/JSON wants
            assert TRACE_A.encode() in body and SPAN_B.encode() in body
        resp = http_ok(url, body, ctype=JSON if is_json else PROTOBUF, compress="gzip" in transport)
        assert resp == Response()
    with httpx.Client(base_url=srv.url, timeout=30, verify=TLS) as c:
        _check_linked(c, service, t)


def test_otlp_port_serves_otlp_only(srv) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(
        f"{srv.otlp_http_url}{QUERIER}/ProfileTypes", json=window(T0), timeout=30, verify=TLS
    )
    assert r.status_code == 404


def test_json_accepts_numbers_and_snake_case(srv) -> None:  # type: ignore[no-untyped-def]
    """OTLP/JSON written by hand: integers as numbers, not strings; lowerCamelCase keys."""
    t = T0 + 5500
    doc = {
        "resourceProfiles": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "handmade"}}]
                },
                "scopeProfiles": [
                    {
                        "profiles": [
                            {
                                "sampleType": {"typeStrindex": 1, "unitStrindex": 2},
                                "periodType": {"typeStrindex": 3, "unitStrindex": 4},
                                "period": PERIOD,
                                "timeUnixNano": t * NS,
                                "samples": [{"stackIndex": 1, "values": [2], "linkIndex": 1}],
                            }
                        ]
                    }
                ],
            }
        ],
        "dictionary": {
            "stringTable": ["", "samples", "count", "cpu", "nanoseconds", "handmade_fn"],
            "functionTable": [{}, {"nameStrindex": 5}],
            "locationTable": [{}, {"lines": [{"functionIndex": 1}]}],
            "stackTable": [{}, {"locationIndices": [1]}],
            "linkTable": [{}, {"traceId": TRACE_A.upper(), "spanId": SPAN_A}],
        },
    }
    assert http_ok(srv.url, json.dumps(doc).encode(), ctype=JSON) == Response()
    with httpx.Client(base_url=srv.url, timeout=30, verify=TLS) as c:
        graph = graph_at(c, '{service_name="handmade"}', t, spanSelector=[SPAN_A])
        assert stacks_of(graph) == {("handmade_fn",): 2 * PERIOD}
        traced = graph_at(c, '{service_name="handmade"}', t, traceIdSelector=[TRACE_A])
        assert stacks_of(traced) == {("handmade_fn",): 2 * PERIOD}


# --- 5. bad input ----------------------------------------------------------------------------


BASELINE_T = T0 + 6000


@pytest.fixture(scope="module")
def baseline(srv) -> RunningServer:  # type: ignore[no-untyped-def]
    """Data stored before any bad request, which must come out unchanged after each."""
    assert http_ok(srv.url, cpu_request("baseline", BASELINE_T).pb()) == Response()
    _still_intact(srv)
    return srv


def _still_intact(srv: RunningServer) -> None:
    assert srv.process.poll() is None, "server died"
    with httpx.Client(base_url=srv.url, timeout=30, verify=TLS) as c:
        graph = graph_at(c, '{service_name="baseline"}', BASELINE_T)
        assert function_totals(graph) == cpu_totals()
        assert label_values(c, BASELINE_T, "service_name") == ["baseline"]


def _valid(t: int = T0 + 7000) -> Builder:
    return cpu_request("should-not-land", t)


def _bad(change) -> Builder:  # type: ignore[no-untyped-def]
    b = _valid()
    change(b, b.msg.resource_profiles[0].scope_profiles[0].profiles[0])
    return b


def _set(obj, **fields) -> None:  # type: ignore[no-untyped-def]
    for k, v in fields.items():
        setattr(obj, k, v)


def _truncated() -> bytes:
    body = _valid().pb()
    cut = body[: len(body) - 7]
    with pytest.raises(DecodeError):
        Request.FromString(cut)  # really not a message
    return cut


# name -> (body builder, words the reason must contain)
BAD_PROTOBUF = {
    "truncated protobuf": (_truncated, "protobuf"),
    "garbage": (lambda: b"\x0a\xff\xff\xff\xff\x0f not otlp", "protobuf"),
    "stack index": (
        lambda: _bad(lambda b, p: _set(p.samples[0], stack_index=99)).pb(),
        "stack index 99",
    ),
    "negative stack index": (
        lambda: _bad(lambda b, p: _set(p.samples[0], stack_index=-1)).pb(),
        "stack index -1",
    ),
    "location index": (
        lambda: _bad(
            lambda b, p: b.d.stack_table[p.samples[0].stack_index].location_indices.append(77)
        ).pb(),
        "location index 77",
    ),
    "function index": (
        lambda: _bad(lambda b, p: _set(b.d.location_table[1].lines[0], function_index=55)).pb(),
        "function index 55",
    ),
    "string index": (
        lambda: _bad(lambda b, p: _set(b.d.function_table[1], name_strindex=500)).pb(),
        "string index 500",
    ),
    "sample type string index": (
        lambda: _bad(lambda b, p: _set(p.sample_type, type_strindex=300)).pb(),
        "string index 300",
    ),
    "attribute index": (
        lambda: _bad(lambda b, p: p.samples[0].attribute_indices.append(66)).pb(),
        "attribute index 66",
    ),
    "link index": (
        lambda: _bad(lambda b, p: _set(p.samples[0], link_index=5)).pb(),
        "link index 5",
    ),
    "no values nor timestamps": (
        lambda: _bad(lambda b, p: p.samples[0].ClearField("values")).pb(),
        "neither",
    ),
    "no sample type": (lambda: _bad(lambda b, p: p.ClearField("sample_type")).pb(), "sample type"),
    "negative value": (
        lambda: _bad(lambda b, p: p.samples[0].values.__setitem__(0, -3)).pb(),
        str(-3 * PERIOD),
    ),
    "profile time 1970 (as Pyroscope's tests stamp)": (
        lambda: _bad(lambda b, p: _set(p, time_unix_nano=239)).pb(),
        "239",
    ),
    "sample timestamp 1970": (
        lambda: _bad(lambda b, p: p.samples[0].timestamps_unix_nano.append(NS)).pb(),
        str(NS),
    ),
    "sample timestamp in 2500": (
        lambda: _bad(
            lambda b, p: p.samples[0].timestamps_unix_nano.append(16_725_225_600 * NS)
        ).pb(),
        "16725225600",
    ),
    "profile time at the end of uint64": (
        lambda: _bad(lambda b, p: _set(p, time_unix_nano=2**64 - 1)).pb(),
        str(2**64 - 1),
    ),
}

BAD_JSON = {
    "not json": (b"{not json", "JSON"),
    "json array": (b"[1, 2]", "object"),
    "wrong field type": (b'{"resourceProfiles": "many"}', "ExportProfilesServiceRequest"),
    "odd hex id": (
        b'{"dictionary": {"linkTable": [{}, {"traceId": "abc"}]}}',
        "traceId",
    ),
    "index out of range in json": (None, "stack index 42"),
    # The year 3000 in nanoseconds does not fit in the fixed64 field.
    "year 3000": (
        b'{"resourceProfiles": [{"scopeProfiles": [{"profiles": [{"timeUnixNano": "'
        + str(32_503_680_000 * NS).encode()
        + b'"}]}]}]}',
        "timeUnixNano",
    ),
}


def _bad_json_body(name: str) -> bytes:
    body, _ = BAD_JSON[name]
    if body is not None:
        return body
    return _bad(lambda b, p: _set(p.samples[1], stack_index=42)).json()


@pytest.mark.parametrize("case", list(BAD_PROTOBUF))
def test_bad_protobuf_is_refused_with_a_reason(baseline, case: str) -> None:  # type: ignore[no-untyped-def]
    make, words = BAD_PROTOBUF[case]
    body = make()
    r = post(baseline.url, body)
    assert r.status_code == 400, (r.status_code, r.content[:300])
    status = http_status(r)
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert words in status.message, status.message
    assert "no profile could be stored" in status.message or "protobuf" in status.message

    err = grpc_error(baseline.otlp_grpc_address, body)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in err.details(), err.details()
    _still_intact(baseline)
    with httpx.Client(base_url=baseline.url, timeout=30, verify=TLS) as c:
        assert "should-not-land" not in label_values(c, T0 + 7000, "service_name")


@pytest.mark.parametrize("case", list(BAD_JSON))
def test_bad_json_is_refused_with_a_reason(baseline, case: str) -> None:  # type: ignore[no-untyped-def]
    r = post(baseline.url, _bad_json_body(case), ctype=JSON)
    assert r.status_code == 400, (r.status_code, r.content[:300])
    assert r.headers["content-type"].startswith(JSON)
    status = http_status(r)
    assert BAD_JSON[case][1] in status.message, status.message
    _still_intact(baseline)


def test_one_bad_profile_is_a_partial_success(baseline) -> None:  # type: ignore[no-untyped-def]
    for transport in ("protobuf", "json", "grpc"):
        t = T0 + 8000 + {"protobuf": 0, "json": 100, "grpc": 200}[transport]
        b = cpu_request(f"partial-{transport}", t)
        bad = b.profile(time_ns=t * NS, same_scope=True)
        bad.samples.add(stack_index=b.frames("never"), values=[1])
        bad.samples.add(stack_index=1000, values=[1])
        if transport == "grpc":
            resp = grpc_export(baseline.otlp_grpc_address, b.msg)
        elif transport == "json":
            resp = http_ok(baseline.url, b.json(), ctype=JSON)
        else:
            resp = http_ok(baseline.url, b.pb())
        assert resp.partial_success.rejected_profiles == 1, transport
        assert "profile 1" in resp.partial_success.error_message
        assert "stack index 1000" in resp.partial_success.error_message
        with httpx.Client(base_url=baseline.url, timeout=30, verify=TLS) as c:
            graph = graph_at(c, f'{{service_name="partial-{transport}"}}', t)
            assert function_totals(graph) == cpu_totals(), transport  # "never" was not stored
    _still_intact(baseline)


def test_mapping_index_out_of_range_is_refused(baseline) -> None:  # type: ignore[no-untyped-def]
    b = Builder()
    p = b.profile(resource={"service.name": "should-not-land"}, time_ns=(T0 + 7000) * NS)
    p.samples.add(stack_index=b.stack(b.location(mapping=99, address=0x10)), values=[1])
    r = post(baseline.url, b.pb())
    assert r.status_code == 400 and "mapping index 99" in http_status(r).message


def test_empty_request_is_accepted(baseline) -> None:  # type: ignore[no-untyped-def]
    assert http_ok(baseline.url, b"") == Response()
    assert http_ok(baseline.url, b"{}", ctype=JSON) == Response()
    assert grpc_raw(baseline.otlp_grpc_address, b"") == Response()
    _still_intact(baseline)


@pytest.mark.parametrize(
    "headers, status",
    [
        ({"content-type": "text/plain"}, 415),
        ({"content-type": "application/octet-stream"}, 415),
        ({"content-type": "application/grpc"}, 415),
        ({"content-type": PROTOBUF, "content-encoding": "br"}, 415),
        ({"content-type": PROTOBUF, "content-encoding": "gzip"}, 400),  # not gzip
        ({"content-type": PROTOBUF, "X-Scope-OrgID": "bad tenant/../x"}, 400),
    ],
)
def test_bad_request_headers(baseline, headers: Dict[str, str], status: int) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(
        baseline.url + PATH, content=_valid().pb(), headers=headers, timeout=30, verify=TLS
    )
    assert r.status_code == status, r.content[:300]
    assert len(http_status(r).message) > 5
    _still_intact(baseline)


def test_early_errors_answer_a_json_request_in_json(baseline) -> None:  # type: ignore[no-untyped-def]
    r = post(baseline.url, _valid().json(), ctype=JSON, headers={"X-Scope-OrgID": "bad/tenant"})
    assert r.status_code == 400
    assert r.headers["content-type"].startswith(JSON)
    assert "tenant" in json.loads(r.content)["message"]


def test_grpc_bad_tenant_is_invalid_argument(baseline) -> None:  # type: ignore[no-untyped-def]
    err = grpc_error(baseline.otlp_grpc_address, _valid().pb(), [("x-scope-orgid", "no spaces")])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "tenant" in err.details()


# --- tenants and tokens ----------------------------------------------------------------------


def test_tenants_are_kept_apart(srv) -> None:  # type: ignore[no-untyped-def]
    t = T0 + 9000
    assert (
        http_ok(srv.url, cpu_request("tenanted", t, 1).pb(), headers={"X-Scope-OrgID": "team-a"})
        == Response()
    )
    assert (
        grpc_export(
            srv.otlp_grpc_address, cpu_request("tenanted", t, 2).msg, [("x-scope-orgid", "team-b")]
        )
        == Response()
    )
    assert (
        http_ok(
            srv.otlp_http_url,
            cpu_request("tenanted", t, 3).json(),
            ctype=JSON,
            headers={"X-Scope-OrgID": "team-c"},
        )
        == Response()
    )
    with httpx.Client(base_url=srv.url, timeout=30, verify=TLS) as c:
        for tenant, weight in (("team-a", 1), ("team-b", 2), ("team-c", 3)):
            graph = flamegraph(
                c, '{service_name="tenanted"}', t - 60, t + 60, headers={"X-Scope-OrgID": tenant}
            )
            assert function_totals(graph) == cpu_totals(weight), tenant
        # The default tenant saw none of it.
        assert "tenanted" not in label_values(c, t, "service_name")


def test_ingest_token_is_required(tmp_path) -> None:  # type: ignore[no-untyped-def]
    s = start_server(tmp_path / "data", ["--ingest-token", "s3cret,other"])
    try:
        t = T0 + 10_000
        body = cpu_request("guarded", t).pb()
        for url in (s.url, s.otlp_http_url):
            assert post(url, body).status_code == 401
            assert post(url, body, headers={"authorization": "Bearer wrong"}).status_code == 401
            r = post(url, body, headers={"authorization": "Bearer"})
            assert r.status_code == 401 and "token" in http_status(r).message
        for metadata in ([], [("authorization", "Bearer wrong")], [("authorization", "s3cret")]):
            err = grpc_error(s.otlp_grpc_address, body, metadata)
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED, metadata
        with httpx.Client(base_url=s.url, timeout=30, verify=TLS) as c:
            assert profile_types(c, t) == []  # nothing got in

        assert post(s.url, body, headers={"authorization": "Bearer s3cret"}).status_code == 200
        ok = grpc_export(
            s.otlp_grpc_address,
            cpu_request("guarded", t + 1000).msg,
            [("authorization", "Bearer other"), ("x-scope-orgid", "team-g")],
        )
        assert ok == Response()
        with httpx.Client(base_url=s.url, timeout=30, verify=TLS) as c:
            assert function_totals(graph_at(c, '{service_name="guarded"}', t)) == cpu_totals()
            graph = flamegraph(
                c,
                '{service_name="guarded"}',
                t + 940,
                t + 1060,
                headers={"X-Scope-OrgID": "team-g"},
            )
            assert function_totals(graph) == cpu_totals()
    finally:
        s.stop()
        if s.process.stdout:
            s.process.stdout.close()
