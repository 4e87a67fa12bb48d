"""Writes the fuzz seeds in tests/fuzz/corpus/<target>/ from the project's own producers.

    python3 tests/fuzz/make_seeds.py

Real producers where there are some: the agent's pprof writer, runtime/pprof (a Go program,
when ``go`` is installed), the OpenTelemetry SDK's OTLP exporter encoding; otherwise the test
suite's writers (JFR chunks to the format's specification, OTLP profiles with a dictionary).
Each seed stays a few KiB: the fuzzer mutates small inputs fastest.  The real-world profiles
of ../shared are not copied here (they are not this project's to ship): pass them to
``run.py --extra-seeds`` for a local run.
"""

from __future__ import annotations

import gzip
import json
import sys
import tempfile
from pathlib import Path
from typing import Dict

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MAX_SEED = 8192


def pprof_seeds() -> Dict[str, bytes]:
    from hotspan.agent.pprof_writer import PyProfileWriter
    from hotspan.formats.pprof import ProfileBuilder
    from hotspan.model.profile import Frame
    from tests.helpers import GO, build_go_profiles, make_pprof

    out: Dict[str, bytes] = {}
    w = PyProfileWriter(("cpu", "nanoseconds"), ("cpu", "nanoseconds"), 10_000_000)
    main = ("main", "app.py", 3, 1)
    work = ("work", "app.py", 12, 10)
    w.add((work, main), 30_000_000, (("span_id", "00f067aa0ba902b7"), ("region", "eu")))
    w.add((main,), 10_000_000, (("trace_id", "4bf92f3577b34da6a3ce929d0e0e4736"),))
    out["agent-cpu.pb.gz"] = w.encode(1_700_000_000 * 10**9, 10**10)
    out["agent-cpu.pb"] = w.encode_raw(1_700_000_000 * 10**9, 10**10)
    heap = PyProfileWriter(
        [("alloc_objects", "count"), ("alloc_space", "bytes")], ("space", "bytes"), 524288
    )
    heap.add((work, main), (2, 1024))
    out["agent-heap.pb"] = heap.encode_raw(1_700_000_000 * 10**9, 10**10)
    b = ProfileBuilder([("samples", "count"), ("cpu", "nanoseconds")], ("cpu", "nanoseconds"), 1)
    b.add([Frame("main", "m.go", 1), Frame("inlined", "m.go", 9)], [1, 10_000_000])
    b.profile.time_nanos = 1_700_000_000 * 10**9
    out["builder-two-types.pb"] = b.profile.SerializeToString()
    out["labels.pb"] = make_pprof(
        [(["leaf", "mid", "root"], 7, {"span_id": "b7ad6b7169203331", "k": "v"})],
        compress=False,
        time_ns=1_700_000_000 * 10**9,
    )
    if GO is not None:
        with tempfile.TemporaryDirectory() as tmp:
            go = build_go_profiles(Path(tmp))
            for name, path in (("go-cpu.pb", go.cpu), ("go-heap.pb", go.heap)):
                raw = gzip.decompress(path.read_bytes())
                if len(raw) <= MAX_SEED:
                    out[name] = raw
                elif len(path.read_bytes()) <= MAX_SEED:
                    out[name + ".gz"] = path.read_bytes()
    return out


def jfr_seeds() -> Dict[str, bytes]:
    from tests.formats.test_jfr import (
        EXEC,
        LIVE,
        MONITOR,
        OTHER,
        PARK,
        STACKS,
        TLAB,
        WALL_SAMPLE,
        Enc,
        chunk,
        labels_snapshot,
    )
    from tests.fuzz.targets import LABELS_SEPARATOR

    events = [
        (EXEC, (1, 0, 1, 0xA1, 4)),
        (EXEC, (2, 1, 2, 0, 0)),
        (OTHER, ("skipped by its size",)),
        (MONITOR, (500, 2, 0)),
        (TLAB, (3, 4096, 0)),
        (LIVE, (1,)),
        (PARK, (90, 1)),
    ]
    out = {
        "every-event.jfr": chunk(STACKS, events, Enc(True)),
        "fixed-ints.jfr": chunk(STACKS, events[:3], Enc(False)),
        "wall.jfr": chunk(STACKS, [(WALL_SAMPLE, (1, 0, 3))], setting="wall"),
        "two-chunks.jfr": chunk(STACKS, events[:1]) + chunk(STACKS, events[:2], id_base=50),
    }
    out["with-labels.jfr"] = out["every-event.jfr"] + LABELS_SEPARATOR + labels_snapshot()
    out["every-event.jfr.gz"] = gzip.compress(out["every-event.jfr"], mtime=0)
    return out


def otlp_traces_seeds() -> Dict[str, bytes]:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import Status, StatusCode

    from hotspan.formats.otlp import encode_json

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "shop", "k8s.pod": "p"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("fuzz-seeds", "1.0")
    with tracer.start_as_current_span("GET /cart", attributes={"http.status_code": 200}) as root:
        root.add_event("cache miss", {"key": "cart:1"})
        with tracer.start_as_current_span("SELECT", attributes={"db.rows": 3.5, "ok": True}) as s:
            s.set_status(Status(StatusCode.ERROR, "timeout"))
    request = encode_spans(exporter.get_finished_spans())
    return {
        "sdk-spans.pb": request.SerializeToString(),
        "sdk-spans.json": json.dumps(encode_json(request)).encode(),
    }


def otlp_profiles_seeds() -> Dict[str, bytes]:
    from tests.server.otlp.test_otlp_profiles import SPAN_A, TRACE_A, Builder, cpu_request

    out = {"cpu.pb": cpu_request("shop", 1_700_000_000).pb()}
    b = Builder()
    mapping = b.mapping("/usr/lib/libc.so.6")
    p = b.profile(
        resource={"service.name": "shop", "pid": 7},
        sample_type=("alloc_space", "bytes"),
        period_type=None,
        period=0,
        attributes=[b.attr("thread.name", "main")],
    )
    native = b.stack(b.location(mapping=mapping, address=0x1234), b.location(("main", 4)))
    inlined = b.stack(b.location(("inner", 2), ("outer", 9)))
    p.samples.add(
        stack_index=native, values=[10, 20], timestamps_unix_nano=[1_700_000_000 * 10**9] * 2
    )
    p.samples.add(stack_index=inlined, values=[5], link_index=b.link(TRACE_A, SPAN_A))
    out["alloc-mapping-inlined.pb"] = b.pb()
    out["alloc-mapping-inlined.json"] = b.json()
    return out


def body_seeds() -> Dict[str, bytes]:
    from hotspan.formats.proto import push_pb2
    from tests.fuzz.targets import BOUNDARY

    pprof = pprof_seeds_small()
    multipart = (
        f"--{BOUNDARY}\r\n"
        'Content-Disposition: form-data; name="profile"; filename="profile.pprof"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode() + pprof
    multipart += (
        f"\r\n--{BOUNDARY}\r\n"
        'Content-Disposition: form-data; name="sample_type_config"\r\n\r\n'
        '{"cpu": {"units": "nanoseconds", "display-name": "cpu"}}'
        f"\r\n--{BOUNDARY}--\r\n"
    ).encode()
    push = push_pb2.PushRequest()
    series = push.series.add()
    series.labels.add(name="service_name", value="shop")
    series.samples.add(raw_profile=gzip.compress(pprof, mtime=0))
    from google.protobuf import json_format

    return {
        "gunzip.bin": b"\x00" + gzip.compress(b"two", mtime=0) + gzip.compress(b"!", mtime=0),
        "read-body-gzip.bin": b"\x01" + gzip.compress(pprof, mtime=0),
        "multipart.bin": b"\x02" + multipart,
        "push-proto.bin": b"\x03" + push.SerializeToString(),
        "push-json.bin": b"\x04" + json_format.MessageToJson(push, indent=None).encode(),
    }


def stacks_seeds() -> Dict[str, bytes]:
    from tests.formats.test_pyroscope_binary import tree_of, trie_of

    stacks = {"main;checkout;tax": 30, "main;checkout": 10, "main;idle": 5, "x;ü": 1}
    speedscope = {
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": {"frames": [{"name": "main"}, {"name": "work"}]},
        "profiles": [
            {
                "type": "sampled",
                "name": "cpu",
                "unit": "milliseconds",
                "startValue": 0,
                "endValue": 30,
                "samples": [[0, 1], [0]],
                "weights": [20, 10],
            },
            {
                "type": "evented",
                "name": "wall",
                "unit": "none",
                "startValue": 0,
                "endValue": 9,
                "events": [
                    {"type": "O", "frame": 0, "at": 0},
                    {"type": "O", "frame": 1, "at": 2},
                    {"type": "C", "frame": 1, "at": 7},
                    {"type": "C", "frame": 0, "at": 9},
                ],
            },
        ],
    }
    return {
        "folded.txt": b"\x00" + "".join(f"{k} {v}\n" for k, v in stacks.items()).encode(),
        "lines.txt": b"\x01main;checkout\nmain;checkout\nmain;idle\n",
        "speedscope.json": b"\x02" + json.dumps(speedscope).encode(),
        "trie.bin": b"\x03" + trie_of(stacks),
        "tree.bin": b"\x04" + tree_of(stacks),
    }


def pprof_seeds_small() -> bytes:
    from tests.helpers import make_pprof

    return make_pprof([(["b", "a"], 3, {"k": "v"})], compress=False, time_ns=1_700_000_000 * 10**9)


def json_dictionary(message_class) -> bytes:  # type: ignore[no-untyped-def]
    """A libFuzzer dictionary of the JSON names of a message's fields, nested ones included:
    byte mutations alone rarely spell ``"resourceSpans"``."""
    names = set()
    todo = [message_class.DESCRIPTOR]
    seen = set()
    while todo:
        descriptor = todo.pop()
        if descriptor.full_name in seen:
            continue
        seen.add(descriptor.full_name)
        for f in descriptor.fields:
            names.add(f.json_name)
            if f.message_type is not None:
                todo.append(f.message_type)
    return "".join(f'"\\"{name}\\":"\n' for name in sorted(names)).encode()


def dictionaries() -> Dict[str, bytes]:
    from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
        ExportProfilesServiceRequest,
    )
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    return {
        "otlp_traces": json_dictionary(ExportTraceServiceRequest),
        "otlp_profiles": json_dictionary(ExportProfilesServiceRequest),
    }


def main() -> None:
    sys.path.insert(0, str(ROOT))
    seeds = {
        "pprof_c": pprof_seeds(),
        "jfr": jfr_seeds(),
        "otlp_traces": otlp_traces_seeds(),
        "otlp_profiles": otlp_profiles_seeds(),
        "body": body_seeds(),
        "stacks": stacks_seeds(),
    }
    seeds["pprof_python"] = seeds["pprof_c"]
    for target, files in seeds.items():
        directory = HERE / "corpus" / target
        directory.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            if len(data) > MAX_SEED:
                print(f"{target}/{name}: {len(data)} bytes, over {MAX_SEED}: left out")
                continue
            (directory / name).write_bytes(data)
            print(f"{target}/{name}: {len(data)} bytes")
    for target, text in dictionaries().items():
        (HERE / "dicts").mkdir(exist_ok=True)
        (HERE / "dicts" / f"{target}.dict").write_bytes(text)


if __name__ == "__main__":
    main()
